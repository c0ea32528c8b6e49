"""Builders over existing ops: no op class and no kernel of their own. ``fft.py``
(``stft``, ``psd_real``, ``fft_conv1d``, ``fftfreq``; registered as Graph methods when
``rlx.ops`` is imported) and ``losses.py`` (``cross_entropy``, ``mse``, ``accuracy``)."""
