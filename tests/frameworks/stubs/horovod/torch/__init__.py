"""A single-process stub of `horovod.torch`, written from Horovod's documented API (the
`hvd.DistributedOptimizer` docstring and the PyTorch usage guide, Horovod 0.28), so that an
exported `trainplan_horovod.py` can be run on real PyTorch without Horovod:

    DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set)

It enforces what the documentation states about the arguments — `named_parameters` is a
sequence of (name, parameter) tuples with unique names covering every parameter the optimizer
updates; `groups` is a non-negative integer or a list of lists of torch.Tensor, a parameter in at
most one list; gradients may be computed at most `backward_passes_per_step` times before
`step()` / `synchronize()`; `step()` after `synchronize()` belongs inside
`skip_synchronize()` — and records every call in `CALLS` for the test to inspect. With one
process the all-reduce is the identity: no communication is simulated. Nothing here is copied
from Horovod's sources.
"""

import contextlib
import warnings

import torch


class _ProcessSet:
    def included(self):
        return True


global_process_set = _ProcessSet()


class Average:
    pass


class Sum:
    pass


class Adasum:
    pass


class Compressor:
    """The documented compressor interface: compress(tensor) -> (tensor, ctx), decompress."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    pass


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None else tensor


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor
    fp16 = FP16Compressor


CALLS = []
_state = {"initialized": False}


def init(comm=None, process_sets=None):
    _state["initialized"] = True


def _need_init():
    if not _state["initialized"]:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def size():
    _need_init()
    return 1


def rank():
    _need_init()
    return 0


def local_rank():
    _need_init()
    return 0


def local_size():
    _need_init()
    return 1


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    _need_init()
    CALLS.append(("broadcast_parameters", {"root_rank": root_rank}))


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    _need_init()
    CALLS.append(("broadcast_optimizer_state", {"root_rank": root_rank}))


def _check(optimizer, named_parameters, compression, backward_passes_per_step, groups):
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is not None:
        named_parameters = list(named_parameters)
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter)")
        names = [n for n, _ in named_parameters]
        if len(set(names)) != len(names):
            raise ValueError("Parameter names in named_parameters must be unique")
        named = {id(p) for _, p in named_parameters}
        if any(id(p) not in named for p in params):
            raise ValueError("named_parameters was specified, but one or more model parameters were not named")
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError("compression must be one of hvd.Compression's algorithms")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be a positive integer")
    if groups is not None:
        if isinstance(groups, list):
            seen = set()
            for group in groups:
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor")
                    if id(p) in seen:
                        raise ValueError("A parameter can only appear once in groups")
                    seen.add(id(p))
        elif not (isinstance(groups, int) and groups >= 0):
            raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor")
    return named_parameters


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=Compression.none,
                         backward_passes_per_step=1,
                         op=Average,
                         gradient_predivide_factor=1.0,
                         num_groups=0, groups=None,
                         sparse_as_dense=False,
                         process_set=global_process_set):
    """The documented signature; returns the optimizer's own class extended with
    synchronize(), skip_synchronize() and a counting step()."""
    _need_init()
    named_parameters = _check(optimizer, named_parameters, compression, backward_passes_per_step, groups)
    names = {id(p): n for n, p in (named_parameters or [])}
    CALLS.append((
        "DistributedOptimizer",
        {
            "groups": None if groups is None or isinstance(groups, int)
            else [[names.get(id(p), "?") for p in g] for g in groups],
            "backward_passes_per_step": backward_passes_per_step,
            "compression": compression.__name__,
            "op": op.__name__,
            "named": len(names),
        },
    ))
    base = optimizer.__class__

    class _Distributed(base):
        def __init__(self):
            self.__dict__.update(optimizer.__dict__)
            self._hvd_passes = {}
            self._hvd_synchronized = False
            self._hvd_should_sync = True
            self.hvd_steps = 0
            self.hvd_synchronizes = 0
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad:
                        p.register_post_accumulate_grad_hook(self._hvd_hook)

        def _hvd_hook(self, p):
            n = self._hvd_passes.get(id(p), 0) + 1
            if n > backward_passes_per_step:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before call to step()"
                )
            self._hvd_passes[id(p)] = n

        def synchronize(self):
            self.hvd_synchronizes += 1
            self._hvd_passes.clear()
            self._hvd_synchronized = True

        @contextlib.contextmanager
        def skip_synchronize(self):
            self._hvd_should_sync = False
            try:
                yield
            finally:
                self._hvd_should_sync = True

        def step(self, closure=None):
            if self._hvd_should_sync:
                if self._hvd_synchronized:
                    warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after optimizer.synchronize()")
                self.synchronize()
            self._hvd_synchronized = False
            self.hvd_steps += 1
            return base.step(self, closure)

    _Distributed.__name__ = base.__name__
    return _Distributed()
