"""Configuration of the instrumentation: :class:`FuzzyConfig` and its environment form.

The environment variables play the role of Verificarlo's ``VFC_BACKENDS``: a script run
by ``numvar run`` (or by hand) is instrumented without changing its code.

=====================  ============================================================
variable               value
=====================  ============================================================
``NUMVAR_MODE``        ``ieee`` | ``sr`` | ``ud`` | ``random`` | ``up`` | ``down`` | ``zero`` |
                       ``farthest`` (unset: no instrumentation)
``NUMVAR_GRANULARITY`` ``flop`` (default) | ``op``
``NUMVAR_PRECISION``   virtual precision in bits, an integer >= 1 (unset: the format's own)
``NUMVAR_FORMAT``      a format name (``e4m3fn``, ``bfloat16``, ...), ``custom:P,E`` or a
                       ``Format.token`` (unset: each tensor's own format)
``NUMVAR_ACCUMULATE``  ``native`` (default) | ``same``
``NUMVAR_SEED``        integer >= 0 (default 0)
``NUMVAR_EXCLUDE``     comma-separated globs over aten op names (``aten.exp*,aten.log*``)
``NUMVAR_INCLUDE``     comma-separated globs, or op kinds of :data:`OP_KINDS` (``matmul``)
``NUMVAR_MODULES``     comma-separated globs over ``named_modules()`` paths
``NUMVAR_STRICT``      ``1`` raises at the first op that would escape (default ``0``)
``NUMVAR_CONTRACTION`` ``separate`` (default) | ``fma``
=====================  ============================================================

``NUMVAR_FLOP_BACKEND`` (``auto`` | ``numba`` | ``triton``) is not part of a
realization's configuration: it picks the backend of the flop kernels, with the same bits
either way (:func:`numvar.instrument.flop.flop_backend`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

MODES = ("ieee", "sr", "ud", "random", "up", "down", "zero", "farthest")
GRANULARITIES = ("flop", "op")
#: contraction semantics of the flop kernels (numvar.instrument.kernels.CONTRACTIONS)
CONTRACTIONS = ("separate", "fma")
ACCUMULATE = ("native", "same")

ENV_VARS = (
    "NUMVAR_MODE",
    "NUMVAR_GRANULARITY",
    "NUMVAR_PRECISION",
    "NUMVAR_SEED",
    "NUMVAR_EXCLUDE",
    "NUMVAR_INCLUDE",
    "NUMVAR_MODULES",
    "NUMVAR_STRICT",
    "NUMVAR_CONTRACTION",
    "NUMVAR_FORMAT",
    "NUMVAR_ACCUMULATE",
)


def _globs(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        items = tuple(value)
    except TypeError:
        raise ConfigError(f"{name} must be a string or a sequence of strings, got {value!r}") from None
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{name} must contain strings, got {item!r}")
        item = item.strip()
        if item:
            out.append(item)
    return tuple(out)


def _split_env(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


@dataclass(frozen=True)
class FuzzyConfig:
    """Everything that defines one instrumented realization.

    ``mode``: ieee | sr | ud | random | up | down | zero | farthest. ``granularity``:
    ``flop`` (every scalar operation, also inside matmul, convolution and reductions) or
    ``op`` (each tensor op's result rounded once). ``precision``: virtual precision in
    significand bits (None: the format's own, 24 for binary32, 53 for binary64; with
    ``format``, that format at ``precision`` bits). ``format``: a
    :class:`numvar.rounding.Format` or its name (``"e4m3fn"``, ``"bfloat16"``,
    ``"custom:7,5"``): every result rounded to it, tensors keeping their dtype (which must
    hold it); None: each tensor's own format. ``accumulate``: ``"native"`` (contractions
    and reductions with a target format below binary32: products and partial sums in
    binary32 under the mode, the result rounded once to the format under the mode, as
    hardware does) or ``"same"`` (every partial sum rounded to the target format). ``seed``: the realization's seed
    (realization i of a series uses ``seed + i``). ``exclude`` / ``include``: globs over
    aten op names (``aten.exp``, ``aten.exp.default``, ``aten.nll_loss*``) or op kinds of
    :data:`numvar.instrument.OP_KINDS`. ``modules``: globs over ``named_modules()`` paths
    of ``model`` (or of the outermost module called). ``model`` is not part of the
    environment form. ``strict``: raise
    :class:`numvar.errors.UninstrumentedOpError` at the first op that would run
    natively or below the requested granularity (default: run it, and list it in the
    block's summary). ``contraction`` (flop granularity): ``"separate"`` rounds every
    product and every add of a matmul, convolution or other contraction (the default);
    ``"fma"`` rounds once per multiply-add, ``acc = RND(acc + a·b)`` with the product
    exact, as fused multiply-add hardware does (half the random draws).
    """

    mode: str = "sr"
    granularity: str = "flop"
    precision: int | None = None
    seed: int = 0
    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] | None = None
    modules: tuple[str, ...] | None = None
    strict: bool = False
    model: Any = field(default=None, compare=False, repr=False)
    contraction: str = "separate"
    format: Any = None
    accumulate: str = "native"

    def __post_init__(self) -> None:
        if not isinstance(self.contraction, str) or self.contraction not in CONTRACTIONS:
            raise ConfigError(f"contraction must be one of {', '.join(CONTRACTIONS)}; "
                              f"got {self.contraction!r}")
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.granularity, str) or self.granularity not in GRANULARITIES:
            raise ConfigError(
                f"granularity must be one of {', '.join(GRANULARITIES)}; got {self.granularity!r}"
            )
        if self.precision is not None:
            if isinstance(self.precision, bool) or not isinstance(self.precision, int) or not (
                1 <= self.precision <= 53
            ):
                raise ConfigError(f"precision must be an integer in [1, 53] or None; got {self.precision!r}")
        if self.format is not None:
            from ..rounding.formats import get_format

            f = get_format(self.format)
            if self.precision is not None and self.precision > f.precision:
                raise ConfigError(f"precision {self.precision} exceeds the {f.precision} bits "
                                  f"of format {f.label}")
            object.__setattr__(self, "format", f)
        if not isinstance(self.accumulate, str) or self.accumulate not in ACCUMULATE:
            raise ConfigError(f"accumulate must be one of {', '.join(ACCUMULATE)}; "
                              f"got {self.accumulate!r}")
        if self.contraction == "fma" and self.format is not None and self.accumulate == "same":
            raise ConfigError("contraction='fma' is not available with format= and "
                              "accumulate='same' (the all-in-the-format kernels round the "
                              "product and the add separately); use accumulate='native'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer; got {self.seed!r}")
        object.__setattr__(self, "exclude", _globs(self.exclude, "exclude"))
        if self.include is not None:
            object.__setattr__(self, "include", _globs(self.include, "include"))
        if self.modules is not None:
            object.__setattr__(self, "modules", _globs(self.modules, "modules"))
        if not isinstance(self.strict, bool):
            raise ConfigError(f"strict must be True or False; got {self.strict!r}")

    # ------------------------------------------------------------------ environment
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FuzzyConfig | None:
        """The configuration in ``environ`` (default ``os.environ``); None if NUMVAR_MODE is unset.

        A bad value raises :class:`numvar.errors.ConfigError` naming the variable.
        """
        env = os.environ if environ is None else environ
        mode = env.get("NUMVAR_MODE", "").strip()
        if not mode:
            return None
        kw: dict[str, Any] = {}
        if mode.lower() not in MODES:
            raise ConfigError(f"NUMVAR_MODE must be one of {', '.join(MODES)}; got {mode!r}")
        kw["mode"] = mode.lower()
        gran = env.get("NUMVAR_GRANULARITY", "").strip()
        if gran:
            if gran.lower() not in GRANULARITIES:
                raise ConfigError(
                    f"NUMVAR_GRANULARITY must be one of {', '.join(GRANULARITIES)}; got {gran!r}"
                )
            kw["granularity"] = gran.lower()
        prec = env.get("NUMVAR_PRECISION", "").strip()
        if prec and prec.lower() not in ("none", "native"):
            try:
                p = int(prec)
            except ValueError:
                raise ConfigError(f"NUMVAR_PRECISION must be an integer in [1, 53]; got {prec!r}") from None
            if not 1 <= p <= 53:
                raise ConfigError(f"NUMVAR_PRECISION must be an integer in [1, 53]; got {prec!r}")
            kw["precision"] = p
        seed = env.get("NUMVAR_SEED", "").strip()
        if seed:
            try:
                s = int(seed)
            except ValueError:
                raise ConfigError(f"NUMVAR_SEED must be a non-negative integer; got {seed!r}") from None
            if s < 0:
                raise ConfigError(f"NUMVAR_SEED must be a non-negative integer; got {seed!r}")
            kw["seed"] = s
        fmt = env.get("NUMVAR_FORMAT", "").strip()
        if fmt:
            kw["format"] = fmt
        acc = env.get("NUMVAR_ACCUMULATE", "").strip()
        if acc:
            if acc.lower() not in ACCUMULATE:
                raise ConfigError(f"NUMVAR_ACCUMULATE must be one of {', '.join(ACCUMULATE)}; "
                                  f"got {acc!r}")
            kw["accumulate"] = acc.lower()
        if "NUMVAR_EXCLUDE" in env:
            kw["exclude"] = _split_env(env["NUMVAR_EXCLUDE"])
        if env.get("NUMVAR_INCLUDE", "").strip():
            kw["include"] = _split_env(env["NUMVAR_INCLUDE"])
        con = env.get("NUMVAR_CONTRACTION", "").strip().lower()
        if con:
            if con not in CONTRACTIONS:
                raise ConfigError(f"NUMVAR_CONTRACTION must be one of {', '.join(CONTRACTIONS)}; "
                                  f"got {con!r}")
            kw["contraction"] = con
        if env.get("NUMVAR_MODULES", "").strip():
            kw["modules"] = _split_env(env["NUMVAR_MODULES"])
        strict = env.get("NUMVAR_STRICT", "").strip().lower()
        if strict:
            if strict not in ("0", "1", "true", "false"):
                raise ConfigError(f"NUMVAR_STRICT must be 0 or 1; got {env['NUMVAR_STRICT']!r}")
            kw["strict"] = strict in ("1", "true")
        for var, key in (("NUMVAR_EXCLUDE", "exclude"), ("NUMVAR_INCLUDE", "include")):
            for g in kw.get(key, ()):
                _check_glob(g, var)
        return cls(**kw)

    def replace(self, **overrides: Any) -> FuzzyConfig:
        """This configuration with some fields changed (``cfg.replace(seed=cfg.seed + i)``);
        run it with ``numvar.instrument.Fuzzy(cfg)``."""
        from dataclasses import replace

        return replace(self, **overrides)

    def to_env(self) -> dict[str, str]:
        """The environment variables that :meth:`from_env` turns back into this configuration."""
        env = {
            "NUMVAR_MODE": self.mode,
            "NUMVAR_GRANULARITY": self.granularity,
            "NUMVAR_SEED": str(self.seed),
            "NUMVAR_EXCLUDE": ",".join(self.exclude),
        }
        if self.precision is not None:
            env["NUMVAR_PRECISION"] = str(self.precision)
        if self.format is not None:
            env["NUMVAR_FORMAT"] = self.format.token
        if self.accumulate != "native":
            env["NUMVAR_ACCUMULATE"] = self.accumulate
        if self.include is not None:
            env["NUMVAR_INCLUDE"] = ",".join(self.include)
        if self.modules is not None:
            env["NUMVAR_MODULES"] = ",".join(self.modules)
        if self.strict:
            env["NUMVAR_STRICT"] = "1"
        if self.contraction != "separate":
            env["NUMVAR_CONTRACTION"] = self.contraction
        for g in (*self.exclude, *(self.include or ()), *(self.modules or ())):
            if "," in g:
                raise ConfigError(f"glob {g!r} contains a comma and cannot be put in an environment variable")
        return env


def _check_glob(g: str, var: str) -> None:
    if any(c.isspace() for c in g):
        raise ConfigError(f"{var}: glob {g!r} contains whitespace")
