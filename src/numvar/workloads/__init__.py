"""Reference workloads: small trained models that run offline, for demos and benchmarks.

- :mod:`numvar.workloads.digits`  LeNet-5 on scikit-learn's digits (the paper's MNIST)
- :mod:`numvar.workloads.brain`   2D U-Net, GM/WM/background on MNI152 (FastSurfer)
- :mod:`numvar.workloads.speech`  WavLM, steady vs tremor voiced signals (WavLM/Parkinson)
- :mod:`numvar.workloads.harmonic` the harmonic series (part of the rounding core)

Each model module has the same API: ``Config`` dataclass (``DigitsConfig``, ...),
``load_data(split, config)``, ``build_model(config)``, ``train(config)``,
``load_or_train(config, cache_dir=None, retrain=False) -> Trained``,
``infer(model, inputs)``, ``evaluate(model, data)`` and ``main(argv)`` (the
``python -m numvar.workloads.NAME`` script). Trained models are cached as safetensors
+ JSON under ``platformdirs.user_cache_dir("numvar")/workloads`` or
``$NUMVAR_CACHE_DIR``. Submodules are imported on demand (brain needs nilearn, speech
needs transformers).
"""

MODELS = ("digits", "brain", "speech")
