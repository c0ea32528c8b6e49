/* AMX tile state shared by the int8 GEMM (qgemm_run.c) and the bf16 GEMM (lowp_gemm.c).
 * In: RLX_AMX_CPUID_EDX, the CPUID.7.0:EDX bits the includer's tiles need (defined before
 * the #include, inside its x86-64 Linux gate). Out: RLX_AMX_BUILD 1, struct amx_cfg,
 * amx_ok() (the CPU has those bits and the kernel grants the tile data state; asked once,
 * cached) and amx_config(on) (load the 8 tiles x 16 rows x 64 bytes configuration, or
 * release the tiles when on = 0). The loaders inline this file where it is #included
 * (rlx.backends.cpu.native.csrc_source), so it is part of each library's cache key. */
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define RLX_AMX_BUILD 1
static int amx_state = -1; /* -1 unknown, 0 no, 1 yes */

static int amx_ok(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s >= 0) return s;
    unsigned ea, eb, ec, ed;
    int ok = 0;
    if (__get_cpuid_count(7, 0, &ea, &eb, &ec, &ed) && (ed & RLX_AMX_CPUID_EDX) == RLX_AMX_CPUID_EDX)
        ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    __atomic_store_n(&amx_state, ok, __ATOMIC_RELEASE);
    return ok;
}

struct amx_cfg {
    uint8_t palette, start_row, pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

__attribute__((target("amx-tile"), noinline)) static void amx_config(int on) {
    if (!on) {
        _tile_release();
        return;
    }
    struct amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    __asm__ volatile("" : : "r"(&cfg) : "memory"); /* gcc drops the stores to cfg otherwise */
    _tile_loadconfig(&cfg);
}
