"""Fused optimizer steps (``torch.optim.Adam/AdamW/SGD/Adagrad(..., fused=True)``) per tensor.

The fused kernels (``aten._fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``,
``_fused_adagrad_``) update lists of tensors in place: parameters, gradients (unscaled by
``grad_scale``) and optimizer state. numvar runs them as the arithmetic of PyTorch's CPU
fused kernel (``aten/src/ATen/native/cpu/Fused*Kernel.cpp``), one tensor at a time, with
the mode re-entered: every tensor op below reaches the handlers and is rounded (at
``flop`` granularity each add, mul, div and sqrt, at ``op`` granularity each op). The
results are copied into every mutated list (exact copies). Scalar hyper-parameters are
converted to the tensor's dtype by the ops, as the kernel converts them to ``scalar_t``;
the arithmetic runs in the parameter's dtype.

Adam / AdamW, per element (``m``, ``v``: exp_avg, exp_avg_sq; ``t``: the step already
incremented by the optimizer)::

    g = g / grad_scale (written back)     g = -g if maximize
    Adam:  g = g + p·wd                   AdamW: p = p·(1 − lr·wd)
    m = lerp(m, g, 1 − β1)                v = v·β2 + ((1 − β2)·g)·g
    v̂ = max(v̂, v) if amsgrad              d = sqrt(v̂ or v) / sqrt(1 − β2^t) + eps
    p = p + ((−lr / (1 − β1^t))·m) / d

SGD: ``g = g/grad_scale; g = −g if maximize; g = g + p·wd``; with momentum
``b = g`` on the first step else ``b = b·μ + g·(1 − dampening)``, then ``g = g + b·μ``
(nesterov) or ``g = b``; ``p = p + g·(−lr)``.

Adagrad: ``g = g/grad_scale; g = −g if maximize; g = g + p·wd``;
``s = s + g·g``; ``p = p + (g·(−lr / (1 + (t − 1)·lr_decay))) / (sqrt(s) + eps)``.

A step whose ``found_inf`` is non-zero changes nothing (as the kernels).
"""

from __future__ import annotations

import math

import torch

from .handlers import PER_TENSOR, register


def _scalar(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _skipped(kwargs) -> bool:
    found_inf = kwargs.get("found_inf")
    return found_inf is not None and _scalar(found_inf) != 0.0


def _unscaled(grad: torch.Tensor, grad_scale) -> torch.Tensor:
    if grad_scale is None:
        return grad
    g = torch.div(grad, grad_scale.to(grad.dtype))
    grad.copy_(g)
    return g


def _adam(args, kwargs, adamw: bool) -> None:
    params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = args[:6]
    if _skipped(kwargs):
        return
    lr = _scalar(kwargs["lr"])
    beta1, beta2 = float(kwargs["beta1"]), float(kwargs["beta2"])
    wd, eps = float(kwargs["weight_decay"]), float(kwargs["eps"])
    amsgrad, maximize = bool(kwargs["amsgrad"]), bool(kwargs["maximize"])
    for i, p in enumerate(params):
        t = _scalar(steps[i])
        step_size = lr / (1 - beta1 ** t)
        bc2_sqrt = math.sqrt(1 - beta2 ** t)
        g = _unscaled(grads[i], kwargs.get("grad_scale"))
        if maximize:
            g = torch.neg(g)
        pv = p
        if wd != 0:
            if adamw:
                pv = torch.mul(p, 1 - lr * wd)
            else:
                g = torch.add(g, torch.mul(p, wd))
        m = torch.lerp(exp_avgs[i], g, 1 - beta1)
        v = torch.add(torch.mul(exp_avg_sqs[i], beta2), torch.mul(torch.mul(g, 1 - beta2), g))
        exp_avgs[i].copy_(m)
        exp_avg_sqs[i].copy_(v)
        if amsgrad:
            v = torch.maximum(max_sqs[i], v)
            max_sqs[i].copy_(v)
        denom = torch.add(torch.div(torch.sqrt(v), bc2_sqrt), eps)
        p.copy_(torch.add(pv, torch.div(torch.mul(m, -step_size), denom)))


def _sgd(args, kwargs) -> None:
    params, grads, bufs = args[:3]
    if _skipped(kwargs):
        return
    lr = _scalar(kwargs["lr"])
    wd, mu = float(kwargs["weight_decay"]), float(kwargs["momentum"])
    damp = float(kwargs["dampening"])
    nesterov, maximize = bool(kwargs["nesterov"]), bool(kwargs["maximize"])
    first = bool(kwargs["is_first_step"])
    for i, p in enumerate(params):
        g = _unscaled(grads[i], kwargs.get("grad_scale"))
        if maximize:
            g = torch.neg(g)
        if wd != 0:
            g = torch.add(g, torch.mul(p, wd))
        if mu != 0:
            b = g if first else torch.add(torch.mul(bufs[i], mu), torch.mul(g, 1 - damp))
            bufs[i].copy_(b)
            g = torch.add(g, torch.mul(b, mu)) if nesterov else b
        p.copy_(torch.add(p, torch.mul(g, -lr)))


def _adagrad(args, kwargs) -> None:
    params, grads, sums, steps = args[:4]
    if _skipped(kwargs):
        return
    lr = _scalar(kwargs["lr"])
    lr_decay, wd, eps = float(kwargs["lr_decay"]), float(kwargs["weight_decay"]), float(kwargs["eps"])
    maximize = bool(kwargs["maximize"])
    for i, p in enumerate(params):
        t = _scalar(steps[i])
        clr = lr / (1 + (t - 1) * lr_decay)
        g = _unscaled(grads[i], kwargs.get("grad_scale"))
        if maximize:
            g = torch.neg(g)
        if wd != 0:
            g = torch.add(g, torch.mul(p, wd))
        s = torch.add(sums[i], torch.mul(g, g))
        sums[i].copy_(s)
        p.copy_(torch.add(p, torch.div(torch.mul(g, -clr), torch.add(torch.sqrt(s), eps))))


_STEPS = {"adam": lambda a, k: _adam(a, k, False), "adamw": lambda a, k: _adam(a, k, True),
          "sgd": _sgd, "adagrad": _adagrad}
#: lists each functional variant returns (the mutated ones, in schema order)
_RETURNED = {"adam": 5, "adamw": 5, "sgd": 3, "adagrad": 3}


def _fused_step(ctx, func, args, kwargs):
    """A fused optimizer op: in place (``_fused_adam_``) or functional (``_fused_adam``:
    the step applied to clones, which are returned)."""
    name = func._schema.name.split("::")[1]
    kind = name[len("_fused_"):].rstrip("_")
    if name.endswith("_"):
        _STEPS[kind](args, kwargs)
        return None
    n = _RETURNED[kind]
    lists = [[t.clone() for t in lst] for lst in args[:n]]
    _STEPS[kind]([*lists, *args[n:]], kwargs)
    return tuple(lists)


for _kind in _STEPS:
    register(f"aten._fused_{_kind}_", f"aten._fused_{_kind}", table=PER_TENSOR,
             how="per tensor (fused optimizer)")(_fused_step)
