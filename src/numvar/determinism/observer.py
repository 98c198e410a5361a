"""The Observer: name the values that must stay bitwise identical, record them once,
verify later runs against that reference.

A reference run (``reference=None``) hashes every observed value and saves the values of
``observe_non_deterministic*`` calls. A verification run (``reference=PATH``) compares
each observation with the reference's observation of the same ``name#occurrence`` and
*substitutes* the saved non-deterministic values (keeping autograd connectivity), so a
model with known randomness (dropout, sampling) can still be checked bit for bit.
"""

from __future__ import annotations

import collections
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._io import atomic_write_json, load_tensors, read_json, save_tensors
from ..errors import ConfigError, NondeterminismError, StoreError
from ._modes import remove_mode
from ._stack import Frame, format_frames, frames_from_json, user_stack
from ._tensors import describe, diff_tensors, hash_value
from .hashmode import HashMode, OpDivergence, OpRecord

__all__ = [
    "ObserverContext", "Observer", "Observation", "ObservationMismatch", "ObserverRun",
    "load_observer_run", "observe", "observe_grad", "observe_non_deterministic",
    "observe_non_deterministic_grad", "enable_hash_mode", "disable_hash_mode",
    "current_observer",
]

log = logging.getLogger(__name__)

FORMAT = "numvar.determinism.observer"
VERSION = 1
KINDS = ("value", "grad", "nondet", "nondet_grad")


# ----------------------------------------------------------------------------- records
@dataclass
class Observation:
    """One observation: its key ``name#k``, kind, pytree structure, per-leaf hash and
    description, user stack, and (non-deterministic ones) the safetensors keys of the
    saved tensor leaves / JSON form of the saved non-tensor leaves."""

    key: str
    name: str
    occurrence: int
    kind: str
    seq: int
    spec: str
    leaves: list[dict[str, Any]]
    stack: list[Frame] = field(default_factory=list)
    saved: list[Any] | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "occurrence": self.occurrence,
                "kind": self.kind, "seq": self.seq, "spec": self.spec, "leaves": self.leaves,
                "stack": [f.to_json() for f in self.stack], "saved": self.saved,
                "note": self.note}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Observation":
        return cls(str(d["key"]), str(d["name"]), int(d["occurrence"]), str(d["kind"]),
                   int(d["seq"]), str(d["spec"]), list(d["leaves"]),
                   frames_from_json(d.get("stack")), d.get("saved"), str(d.get("note", "")))


@dataclass
class ObservationMismatch:
    """A verification run departing from its reference.

    ``kind``: "value" (hashes differ), "structure" (pytree/dtype/shape/kind differ),
    "extra" (not in the reference), "missing" (in the reference, never observed),
    "reordered" (observed in a different order), "op" (HashMode's op sequence diverged).
    """

    kind: str
    key: str
    detail: str
    seq: float
    stack: list[Frame] = field(default_factory=list)
    reference_stack: list[Frame] = field(default_factory=list)

    def format(self, limit: int | None = 8) -> str:
        parts = [f"[{self.kind}] {self.key}: {self.detail}"]
        if self.kind != "missing":
            parts.append("  this run:\n" + format_frames(self.stack, limit, "  "))
        if self.kind != "extra":
            parts.append("  reference:\n" + format_frames(self.reference_stack, limit, "  "))
        return "\n".join(parts)

    __str__ = format

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "detail": self.detail,
                "seq": None if math.isinf(self.seq) else self.seq,
                "stack": [f.to_json() for f in self.stack],
                "reference_stack": [f.to_json() for f in self.reference_stack]}


@dataclass
class ObserverRun:
    """A saved run, as loaded from ``NAME.json`` (+ ``NAME.safetensors``)."""

    path: Path
    name: str
    is_reference: bool
    complete: bool
    observations: list[Observation]
    tensors: dict[str, torch.Tensor]
    ops: list[OpRecord] | None
    op_stacks: list[list[Frame]]
    mismatches: list[dict[str, Any]]
    meta: dict[str, Any]

    @property
    def by_key(self) -> dict[str, Observation]:
        return {o.key: o for o in self.observations}


# ----------------------------------------------------------------------------- file I/O
_st_ok: dict[torch.dtype, bool] = {}


def _safetensors_supports(dtype: torch.dtype) -> bool:
    ok = _st_ok.get(dtype)
    if ok is None:
        from safetensors.torch import save

        try:
            save({"x": torch.zeros(1, dtype=dtype)})
            ok = True
        except Exception:
            ok = False
        _st_ok[dtype] = ok
    return ok


def _encode_tensor(t: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """A safetensors-storable form of ``t`` and the JSON needed to decode it."""
    t = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
    info = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    if _safetensors_supports(t.dtype):
        return t, info
    info["raw"] = True  # stored as its bytes
    return t.reshape(-1).view(torch.uint8), info


def _decode_tensor(t: torch.Tensor, info: dict[str, Any]) -> torch.Tensor:
    if info.get("raw"):
        dtype = getattr(torch, info["dtype"])
        return t.view(dtype).reshape(info["shape"])
    return t


def _encode_py(v: Any) -> dict[str, Any]:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return {"py": type(v).__name__, "value": v}
    if isinstance(v, int):
        return {"py": "int", "value": str(v)}
    if isinstance(v, float):
        return {"py": "float", "value": v.hex()}
    if isinstance(v, complex):
        return {"py": "complex", "value": [v.real.hex(), v.imag.hex()]}
    raise ConfigError(f"observe_non_deterministic cannot save a {type(v).__name__} leaf "
                      "(tensors, numbers, strings, booleans and None are supported)")


def _decode_py(d: dict[str, Any]) -> Any:
    kind, v = d.get("py"), d.get("value")
    if kind == "int":
        return int(v)
    if kind == "float":
        return float.fromhex(v)
    if kind == "complex":
        return complex(float.fromhex(v[0]), float.fromhex(v[1]))
    if kind in ("bool", "NoneType", "str"):
        return v
    raise StoreError(f"corrupt saved value {d!r}")


def _resolve_reference(reference: str | os.PathLike, dump_dir: Path) -> Path:
    p = Path(reference)
    if p.is_file():
        return p
    if p.is_dir():
        found = sorted(q for q in p.glob("*.json") if _looks_like_run(q))
        if len(found) == 1:
            return found[0]
        if not found:
            raise StoreError(f"no observer run (*.json) in reference folder {p}")
        raise ConfigError(f"reference folder {p} holds several runs "
                          f"({', '.join(q.name for q in found)}): pass the .json file")
    if p.with_name(p.name + ".json").is_file():
        return p.with_name(p.name + ".json")
    if os.sep not in str(reference) and (dump_dir / f"{reference}.json").is_file():
        return dump_dir / f"{reference}.json"
    raise StoreError(f"reference not found: {p} (record a reference run first: "
                     "ObserverContext(dump_dir, name) without reference=)")


def _looks_like_run(p: Path) -> bool:
    try:
        with open(p, encoding="utf-8") as f:
            head = f.read(200)
        return FORMAT in head
    except OSError:
        return False


def load_observer_run(path: str | os.PathLike) -> ObserverRun:
    """Load a saved run (JSON + safetensors, nothing unpickled). StoreError when the
    file is missing, corrupt or not an observer run."""
    path = Path(path)
    if path.suffix != ".json" and path.with_suffix(".json").is_file():
        path = path.with_suffix(".json")
    d = read_json(path)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise StoreError(f"{path} is not a numvar observer run")
    if d.get("version") != VERSION:
        raise StoreError(f"{path}: unsupported observer format version {d.get('version')!r}")
    try:
        obs = [Observation.from_json(o) for o in d["observations"]]
        hm = d.get("hash_mode")
        ops, op_stacks = HashMode.records_from_json(hm) if hm else (None, [])
        tensors: dict[str, torch.Tensor] = {}
        if d.get("tensors_file"):
            raw = load_tensors(path.parent / d["tensors_file"])
            infos = d.get("tensors", {})
            for k, info in infos.items():
                if k not in raw:
                    raise StoreError(f"{path}: saved tensor {k!r} missing from "
                                     f"{d['tensors_file']}")
                tensors[k] = _decode_tensor(raw[k], info)
        return ObserverRun(path, str(d["name"]), bool(d["reference"]), bool(d["complete"]),
                           obs, tensors, ops, op_stacks, list(d.get("mismatches", [])),
                           dict(d.get("meta", {})))
    except StoreError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(f"corrupt observer run {path}: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------------------- substitution
class _Substitute(torch.autograd.Function):
    """Forward: the saved value (bit for bit). Backward: the incoming gradient passes
    through to the original tensor unchanged, so the graph stays connected."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.empty_like(x)
        out.copy_(saved)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, None


def _substitute(x: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    saved = saved.to(x.device)
    if x.requires_grad and torch.is_grad_enabled():
        return _Substitute.apply(x, saved)
    out = torch.empty_like(x)
    out.copy_(saved)
    return out


# ----------------------------------------------------------------------------- observer
_ACTIVE: list["Observer"] = []


def current_observer() -> "Observer | None":
    """The innermost active Observer, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class Observer:
    """Records (reference run) or verifies (verification run) named observations.

    Use through :class:`ObserverContext`. Files: ``dump_dir/NAME.json`` (observations,
    hashes, stacks, mismatches, HashMode ops) and ``dump_dir/NAME.safetensors`` (saved
    non-deterministic values, and observed values with ``save_values=True``).
    """

    def __init__(self, dump_dir: str | os.PathLike, name: str,
                 reference: str | os.PathLike | None = None, raise_on_mismatch: bool = False,
                 *, save_values: bool = False, hash_stacks: bool = True) -> None:
        if not name or "/" in name or os.sep in name or name.startswith("."):
            raise ConfigError(f"invalid observer run name {name!r} (a plain file stem)")
        self.dump_dir = Path(dump_dir)
        self.name = name
        self.raise_on_mismatch = raise_on_mismatch
        self.save_values = save_values
        self.hash_stacks = hash_stacks
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        self.json_path = self.dump_dir / f"{name}.json"
        self.tensors_path = self.dump_dir / f"{name}.safetensors"
        self.reference: ObserverRun | None = None
        if reference is not None:
            ref_path = _resolve_reference(reference, self.dump_dir)
            if ref_path.resolve() == self.json_path.resolve():
                raise ConfigError(f"the verification run {name!r} would overwrite its "
                                  f"reference {ref_path}: use another name")
            self.reference = load_observer_run(ref_path)
            self._ref_by_key = self.reference.by_key
            if not self.reference.is_reference:
                raise StoreError(f"{ref_path} is a verification run, not a reference run")
            if not self.reference.complete:
                log.warning("reference %s did not complete (its run raised)", ref_path)
        self.observations: list[Observation] = []
        self.mismatches: list[ObservationMismatch] = []
        self.substituted: list[str] = []   # keys whose values were replaced (and differed)
        self._by_key: dict[str, Observation] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._tensors: dict[str, torch.Tensor] = {}
        self._tensor_info: dict[str, dict[str, Any]] = {}
        self._max_ref_seq = -1
        self._hash_mode: HashMode | None = None
        self._hash_on = False
        self.complete = False
        self.saved = False

    # -- properties ----------------------------------------------------------------------
    @property
    def is_reference(self) -> bool:
        return self.reference is None

    @property
    def hash_mode(self) -> HashMode | None:
        return self._hash_mode

    def _next_key(self, name: str) -> tuple[str, int]:
        if not isinstance(name, str) or not name or "#" in name:
            raise ConfigError(f"observation name must be a non-empty string without '#': "
                              f"{name!r}")
        k = self._counts[name]
        self._counts[name] += 1
        return f"{name}#{k}", k

    # -- recording -----------------------------------------------------------------------
    def _leaves_info(self, leaves: list[Any]) -> list[dict[str, Any]]:
        out = []
        for x in leaves:
            d = describe(x)
            d["hash"] = hash_value(x)
            out.append(d)
        return out

    def _add(self, key: str, name: str, occ: int, kind: str, value: Any,
             stack: list[Frame], saved: list[Any] | None = None) -> Observation:
        leaves, spec = tree_flatten(value)
        if key in self._by_key:  # a grad hook fired again (backward run twice)
            j = 1
            while f"{key}@{j}" in self._by_key:
                j += 1
            key = f"{key}@{j}"
        ob = Observation(key, name, occ, kind, len(self.observations), str(spec),
                         self._leaves_info(leaves), stack, saved)
        self.observations.append(ob)
        self._by_key[key] = ob
        if self.save_values and kind in ("value", "grad"):
            for i, x in enumerate(leaves):
                if isinstance(x, torch.Tensor) and x.layout == torch.strided:
                    self._store(f"{key}/{i}", x)
        return ob

    def _store(self, k: str, t: torch.Tensor) -> None:
        enc, info = _encode_tensor(t.detach().clone())
        self._tensors[k] = enc
        self._tensor_info[k] = info

    def _mismatch(self, kind: str, key: str, detail: str, seq: float,
                  stack: list[Frame], ref_stack: list[Frame]) -> None:
        m = ObservationMismatch(kind, key, detail, seq, stack, ref_stack)
        self.mismatches.append(m)
        log.info("observer mismatch: %s", m.format())
        if self.raise_on_mismatch:
            raise NondeterminismError(m.format(), m)

    def _verify(self, ob: Observation) -> Observation | None:
        """Compare ``ob`` with the reference; returns the reference observation or None."""
        assert self.reference is not None
        ref = self._ref_by_key.get(ob.key)
        if ref is None:
            self._mismatch("extra", ob.key, f"{ob.kind} observation not in the reference",
                           ob.seq, ob.stack, [])
            return None
        if ref.seq < self._max_ref_seq:
            self._mismatch("reordered", ob.key,
                           f"observed after reference observation #{self._max_ref_seq} "
                           f"although the reference observed it as #{ref.seq}",
                           ob.seq, ob.stack, ref.stack)
        self._max_ref_seq = max(self._max_ref_seq, ref.seq)
        problems = self._structure_problems(ob, ref)
        if problems:
            self._mismatch("structure", ob.key, problems, ob.seq, ob.stack, ref.stack)
            return ref
        if ob.kind in ("nondet", "nondet_grad"):
            return ref
        bad = [i for i, (a, b) in enumerate(zip(ob.leaves, ref.leaves)) if a["hash"] != b["hash"]]
        if bad:
            self._mismatch("value", ob.key, self._value_detail(ob, ref, bad), ob.seq,
                           ob.stack, ref.stack)
        return ref

    @staticmethod
    def _structure_problems(ob: Observation, ref: Observation) -> str:
        if ob.kind != ref.kind:
            return f"observed as {ob.kind}, the reference as {ref.kind}"
        if ob.spec != ref.spec or len(ob.leaves) != len(ref.leaves):
            return f"pytree structure differs: {ob.spec} vs reference {ref.spec}"
        for i, (a, b) in enumerate(zip(ob.leaves, ref.leaves)):
            da = {k: v for k, v in a.items() if k != "hash"}
            db = {k: v for k, v in b.items() if k != "hash"}
            if da != db:
                return f"leaf {i}: {da} vs reference {db}"
        return ""

    def _value_detail(self, ob: Observation, ref: Observation, bad: list[int]) -> str:
        parts = []
        for i in bad:
            s = f"leaf {i} ({ob.leaves[i].get('dtype', ob.leaves[i].get('type'))}" \
                f"{ob.leaves[i].get('shape', '')}) differs bitwise"
            a = self._tensors.get(f"{ob.key}/{i}")
            b = self.reference.tensors.get(f"{ref.key}/{i}") if self.reference else None
            if a is not None and b is not None:
                d = diff_tensors(_decode_tensor(a, self._tensor_info[f"{ob.key}/{i}"]), b)
                if d is not None and d.n_differing >= 0:
                    s += f": {d.n_differing} element(s), max |diff| {d.max_abs_diff:.6g}"
            parts.append(s)
        return "; ".join(parts)

    # -- public API ----------------------------------------------------------------------
    def observe(self, name: str, value: Any) -> Any:
        """Record ``value`` (any pytree of tensors and plain values); returns it unchanged."""
        key, occ = self._next_key(name)
        stack = user_stack()
        with _quiet():
            ob = self._add(key, name, occ, "value", value, stack)
            if self.reference is not None:
                self._verify(ob)
        return value

    def observe_grad(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Record the gradient flowing into ``tensor`` during backward (a hook that
        changes nothing); returns ``tensor``."""
        key, occ = self._check_grad_target(name, tensor)
        stack = user_stack()

        def hook(grad: torch.Tensor) -> None:
            with _quiet():
                ob = self._add(key, name, occ, "grad", grad, stack)
                if self.reference is not None:
                    self._verify(ob)
            return None

        tensor.register_hook(hook)
        return tensor

    def observe_non_deterministic(self, name: str, value: Any) -> Any:
        """Reference run: save a detached clone of ``value`` and return ``value``.
        Verification run: return the saved value with the same pytree structure; tensor
        leaves stay connected to ``value``'s autograd graph (the gradient passes through)."""
        key, occ = self._next_key(name)
        stack = user_stack()
        _grad_was_enabled = torch.is_grad_enabled()
        with _quiet():
            leaves, spec = tree_flatten(value)
            if self.reference is None:
                saved: list[Any] = []
                for i, x in enumerate(leaves):
                    if isinstance(x, torch.Tensor):
                        if x.layout != torch.strided:
                            raise ConfigError("observe_non_deterministic: only strided "
                                              f"tensors can be saved ({key} leaf {i} is "
                                              f"{x.layout})")
                        self._store(f"{key}/{i}", x)
                        saved.append(f"{key}/{i}")
                    else:
                        saved.append(_encode_py(x))
                self._add(key, name, occ, "nondet", value, stack, saved)
                return value
            ob = self._add(key, name, occ, "nondet", value, stack)
            ref = self._verify(ob)
            if ref is None or ref.saved is None or self._structure_problems(ob, ref):
                return value  # reported above; nothing sound to substitute
            new = []
            with torch.enable_grad() if _grad_was_enabled else torch.no_grad():
                for x, s in zip(leaves, ref.saved):
                    if isinstance(x, torch.Tensor):
                        new.append(_substitute(x, self._saved_tensor(s)))
                    else:
                        new.append(_decode_py(s))
            if any(a["hash"] != b["hash"] for a, b in zip(ob.leaves, ref.leaves)):
                ob.note = "differed from the reference; reference value substituted"
                self.substituted.append(key)
            else:
                ob.note = "identical to the reference"
            return tree_unflatten(new, spec)

    def observe_non_deterministic_grad(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Like :meth:`observe_non_deterministic` for the gradient flowing into
        ``tensor``: saved in the reference run, replaced by the saved one later."""
        key, occ = self._check_grad_target(name, tensor)
        stack = user_stack()

        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            with _quiet():
                if self.reference is None:
                    ob = self._add(key, name, occ, "nondet_grad", grad, stack)
                    self._store(f"{ob.key}/0", grad)
                    ob.saved = [f"{ob.key}/0"]
                    return None
                ob = self._add(key, name, occ, "nondet_grad", grad, stack)
                ref = self._verify(ob)
                if ref is None or ref.saved is None or self._structure_problems(ob, ref):
                    return None
                saved = self._saved_tensor(ref.saved[0]).to(grad.device)
                if ob.leaves[0]["hash"] != ref.leaves[0]["hash"]:
                    ob.note = "differed from the reference; reference gradient substituted"
                    self.substituted.append(key)
                else:
                    ob.note = "identical to the reference"
                return saved.clone()

        tensor.register_hook(hook)
        return tensor

    def _check_grad_target(self, name: str, tensor: Any) -> tuple[str, int]:
        if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
            raise ConfigError(f"observe_grad({name!r}, ...) needs a tensor that requires grad")
        return self._next_key(name)

    def _saved_tensor(self, key: Any) -> torch.Tensor:
        assert self.reference is not None
        t = self.reference.tensors.get(str(key))
        if t is None:
            raise StoreError(f"reference {self.reference.path}: saved value {key!r} missing")
        return t

    # -- hash mode -----------------------------------------------------------------------
    def enable_hash_mode(self) -> HashMode:
        """Start hashing every aten op (verification runs compare with the reference's)."""
        if self._hash_mode is None:
            ref_ops = ref_stacks = None
            if self.reference is not None:
                if self.reference.ops is None:
                    raise ConfigError(f"the reference {self.reference.path} was recorded "
                                      "without hash mode")
                ref_ops, ref_stacks = self.reference.ops, self.reference.op_stacks
            self._hash_mode = HashMode(record_stacks=self.hash_stacks, reference=ref_ops,
                                       reference_stacks=ref_stacks or ())
        if not self._hash_on:
            self._hash_mode.__enter__()
            self._hash_on = True
        return self._hash_mode

    def disable_hash_mode(self) -> None:
        """Stop hashing; works even when other dispatch modes were entered after it."""
        if self._hash_mode is not None and self._hash_on:
            remove_mode(self._hash_mode)
            self._hash_on = False

    # -- end of run ----------------------------------------------------------------------
    def finish(self, complete: bool = True) -> None:
        """Close the run: missing observations, HashMode divergence, then save."""
        self.disable_hash_mode()
        self.complete = complete
        if self.reference is not None:
            seen = set(self._by_key)
            for ref in self.reference.observations:
                if ref.key not in seen and complete:
                    self._mismatch_noraise("missing", ref.key,
                                           f"{ref.kind} observation of the reference never "
                                           "made in this run", math.inf, [], ref.stack)
            if self._hash_mode is not None and complete:
                d = self._hash_mode.finish()
                if d is not None:
                    self._mismatch_noraise("op", f"op #{d.index}", _op_detail(d, self._hash_mode),
                                           math.inf, d.stack, d.reference_stack)
        self.save()
        if self.raise_on_mismatch and complete:
            late = [m for m in self.mismatches if m.kind in ("missing", "op")]
            if late:
                raise NondeterminismError(self.report(), late[0])

    def _mismatch_noraise(self, *a: Any) -> None:
        self.mismatches.append(ObservationMismatch(*a))

    def sorted_mismatches(self) -> list[ObservationMismatch]:
        """Mismatches in run order (missing and op-sequence ones last)."""
        return sorted(self.mismatches, key=lambda m: m.seq)

    def report(self, limit: int | None = 8) -> str:
        """Text report: first divergence with both stacks, then the rest."""
        if self.reference is None:
            n_nd = sum(o.kind.startswith("nondet") for o in self.observations)
            s = (f"reference run {self.name!r}: {len(self.observations)} observation(s), "
                 f"{n_nd} non-deterministic value(s) saved")
            if self._hash_mode is not None:
                s += f", {len(self._hash_mode.records)} op(s) hashed"
            return s
        ms = self.sorted_mismatches()
        if not ms:
            s = (f"bitwise identical to the reference: {len(self.observations)} "
                 f"observation(s) match")
            if self.substituted:
                s += f" ({len(self.substituted)} non-deterministic value(s) substituted)"
            if self._hash_mode is not None:
                s += f", {len(self._hash_mode.records)} op(s) hashed"
            return s
        lines = [f"{len(ms)} mismatch(es) against reference {self.reference.path}",
                 "first divergence:", ms[0].format(limit)]
        if len(ms) > 1:
            lines.append("then:")
            lines += [m.format(limit) for m in ms[1:]]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "name": self.name,
            "reference": self.reference is None, "complete": self.complete,
            "reference_path": None if self.reference is None else str(self.reference.path),
            "meta": {"torch": torch.__version__},
            "observations": [o.to_json() for o in self.observations],
            "mismatches": [m.to_json() for m in self.sorted_mismatches()],
            "substituted": list(self.substituted),
            "hash_mode": self._hash_mode.to_json() if self._hash_mode is not None else None,
            "tensors_file": self.tensors_path.name if self._tensors else None,
            "tensors": self._tensor_info,
        }

    def save(self) -> Path:
        """Write NAME.safetensors (if any tensors) then NAME.json, atomically."""
        if self._tensors:
            save_tensors(self.tensors_path, self._tensors,
                         metadata={"format": FORMAT, "run": self.name})
        atomic_write_json(self.json_path, self.to_json())
        self.saved = True
        return self.json_path


def _op_detail(d: OpDivergence, mode: HashMode) -> str:
    s = d.format(limit=0).splitlines()[0]
    if d.kind == "hash" and mode.n_differing > 1:
        s += f" ({mode.n_differing} op(s) differ in all while the sequences align)"
    return s


class _quiet:
    """Run observer internals with every dispatch mode (HashMode, the user's) off and
    without recording autograd history."""

    def __enter__(self) -> None:
        self._modes = _disable_current_modes()
        self._modes.__enter__()
        self._ng = torch.no_grad()
        self._ng.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._ng.__exit__(*exc)
        self._modes.__exit__(*exc)


class ObserverContext:
    """``with ObserverContext(dump_dir, name, reference=None) as obs:`` — makes the
    module-level ``observe*`` functions record into ``obs``; on exit computes missing
    observations, saves the run and (``raise_on_mismatch``) raises on late mismatches.

    ``reference``: the reference run's ``.json`` path, the folder holding it, or its name
    within ``dump_dir``. A missing or corrupt reference raises :class:`StoreError`.
    """

    def __init__(self, dump_dir: str | os.PathLike, name: str,
                 reference: str | os.PathLike | None = None, raise_on_mismatch: bool = False,
                 *, save_values: bool = False, hash_stacks: bool = True) -> None:
        self.observer = Observer(dump_dir, name, reference, raise_on_mismatch,
                                 save_values=save_values, hash_stacks=hash_stacks)

    def __enter__(self) -> Observer:
        _ACTIVE.append(self.observer)
        return self.observer

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            _ACTIVE.remove(self.observer)
        except ValueError:
            pass
        if exc_type is None:
            self.observer.finish(complete=True)
        else:
            try:
                self.observer.finish(complete=False)
            except Exception:
                log.exception("could not save the observer run")


# ----------------------------------------------------------------------------- module API
def observe(name: str, value: Any) -> Any:
    """Record ``value`` under ``name`` in the active Observer (no-op outside one)."""
    obs = current_observer()
    return value if obs is None else obs.observe(name, value)


def observe_grad(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Record the gradient flowing into ``tensor`` (no-op outside an Observer)."""
    obs = current_observer()
    return tensor if obs is None else obs.observe_grad(name, tensor)


def observe_non_deterministic(name: str, value: Any) -> Any:
    """Save (reference) or substitute (verification) ``value`` (no-op outside an Observer)."""
    obs = current_observer()
    return value if obs is None else obs.observe_non_deterministic(name, value)


def observe_non_deterministic_grad(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Save or substitute the gradient flowing into ``tensor`` (no-op outside an Observer)."""
    obs = current_observer()
    return tensor if obs is None else obs.observe_non_deterministic_grad(name, tensor)


def enable_hash_mode() -> HashMode | None:
    """Start hashing every op in the active Observer (no-op outside one)."""
    obs = current_observer()
    return None if obs is None else obs.enable_hash_mode()


def disable_hash_mode() -> None:
    """Stop the active Observer's hashing, even under modes entered later."""
    obs = current_observer()
    if obs is not None:
        obs.disable_hash_mode()

