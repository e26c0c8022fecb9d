"""troupe for PyTorch: train your own model under troupe's runtime.

A plain training script calls `troupe.init()`, builds its model, optimizer and
dataset, and loops over `Trainer.steps()`. Run alone (`python3 train.py`) it
trains as one rank; run by `troupe run --world N -- python3 train.py` each
process becomes a worker of an elastic job: its gradients are all-reduced in
place while backward runs, a step is applied only once every rank's share is
in, a step lost to a failure is redone with the same samples, and a process
that joins gets the state from a peer. See docs/PYTHON.md.
"""

import os
import sys
import threading
import traceback

import torch

from ._errors import StateError, Stopped, UnsupportedError, UsageError
from . import _state

__all__ = ["init", "Job", "Trainer", "Step", "MicroBatch", "sample_indices",
           "Stopped", "UsageError", "UnsupportedError", "StateError"]

def _forget_preload():
    # A troupe agent preloads this module's extension into the interpreter (its bind() and
    # connect() sign gloo's pairs; docs/PYTHON.md). The script's own children must not inherit
    # it: a program that is not this interpreter cannot load the extension.
    mine = os.environ.pop("TROUPE_PRELOAD", None)
    if not mine or "LD_PRELOAD" not in os.environ:
        return
    kept = [p for p in os.environ["LD_PRELOAD"].split(":") if p and p != mine]
    if kept:
        os.environ["LD_PRELOAD"] = ":".join(kept)
    else:
        del os.environ["LD_PRELOAD"]


_forget_preload()

_DEFAULT_SEED = 1337
_DEFAULT_BUCKET_BYTES = 4 << 20


def _ext():
    # Imported when first needed, so that the pure parts (the state walk, the
    # errors) stay importable where the extension was not built.
    from . import _native as native
    return native


def managed():
    """Whether this process was started by a troupe agent (a worker of a job)."""
    return "TROUPE_COORDINATOR" in os.environ


def sample_indices(seed, length, global_batch, position, first, count, shuffle=True):
    """troupe's sampler: the dataset indices of slots [first, first + count) of
    the global batch at `position` (a pure function of its arguments)."""
    return _ext().sample_indices(seed, length, global_batch, position, first, count, shuffle)


class Job:
    """The job's settings, as `init()` found them."""

    def __init__(self, steps, last_step, batch, micro_batch, seed, threads, run_dir,
                 bucket_bytes, session=None):
        self.steps = steps
        self.last_step = last_step
        self.batch = batch
        self.micro_batch = micro_batch
        self.seed = seed
        self.threads = threads
        self.run_dir = run_dir
        self.bucket_bytes = bucket_bytes
        self.member = int(os.environ["TROUPE_MEMBER"]) if "TROUPE_MEMBER" in os.environ else None
        self.managed = session is not None
        # Whether this process held rank 0 of the last generation it trained in.
        self.rank_zero = not self.managed
        self._session = session

    def __repr__(self):
        return (f"troupe.Job(steps={self.steps}, batch={self.batch}, "
                f"micro_batch={self.micro_batch}, seed={self.seed}, managed={self.managed})")


_job = None


def init(*, steps=None, batch=None, micro_batch=None, seed=None, threads=None,
         deterministic=True):
    """Joins the job (under troupe) or sets up a run of one (alone); call once,
    before building the model. Under troupe the job's settings win over the
    keywords (the coordinator planned with them); a disagreement is reported.
    A standby process waits here until it is needed."""
    global _job
    if _job is not None:
        raise UsageError("troupe.init() was called twice; call it once, before building the model")
    session = None
    if managed():
        native = _ext()
        session = native.Session()
        name = " ".join(os.path.basename(a) for a in sys.argv[:1]) or "python"
        settings = session.start(name)
        if settings is None:
            code = session.wait_end(30.0)
            code = 1 if code is None else code
            raise Stopped(code, "not needed by the job" if code == 0
                          else "could not join the job (see the log above)")
        given = {"steps": steps, "batch": batch, "micro_batch": micro_batch, "seed": seed,
                 "threads": threads}
        for key, value in given.items():
            if value is not None and value != settings[key]:
                # One write: the workers of a node share the terminal.
                sys.stderr.write(f"troupe: init({key}={value}) differs from the job's {key} "
                                 f"{settings[key]}; the job's is used\n")
        job = Job(settings["steps"], settings["last_step"], settings["batch"],
                  settings["micro_batch"], settings["seed"], settings["threads"],
                  settings["run_dir"], settings["bucket_bytes"], session)
    else:
        if steps is None or batch is None:
            raise UsageError("troupe.init(steps=..., batch=...) needs both when the script "
                             "runs alone (under troupe run they come from the job)")
        micro_batch = batch if micro_batch is None else micro_batch
        if micro_batch < 1 or batch % micro_batch != 0:
            raise UsageError(f"micro_batch ({micro_batch}) must divide batch ({batch})")
        seed = _DEFAULT_SEED if seed is None else seed
        threads = 1 if threads is None else threads
        job = Job(steps, steps, batch, micro_batch, seed, threads, None,
                  _DEFAULT_BUCKET_BYTES)
        # As a worker under troupe does: on a machine where a page's first touch is slow, torch
        # would otherwise fault in its freed and reallocated tensors every step.
        _ext().retain_freed_memory()
    torch.manual_seed(job.seed)
    # Debian's torch multiplies matrices in OpenBLAS, whose threads torch.set_num_threads does
    # not set: alone as under troupe (whose worker sets them), the job's threads are all it uses.
    torch.set_num_threads(max(1, job.threads))
    _ext().set_blas_threads(max(1, job.threads))
    torch.use_deterministic_algorithms(deterministic)
    _job = job
    return job


class MicroBatch:
    """One micro-batch of this rank's share of a step."""

    def __init__(self, trainer, indices, index, weight, seed):
        self._trainer = trainer
        self.indices = indices
        self.index = index
        self.weight = weight
        self.seed = seed

    def batch(self):
        """The samples, collated (default_collate unless the Trainer was given another)."""
        data = self._trainer._dataset
        return self._trainer._collate([data[i] for i in self.indices])


class Step:
    """One step: this rank's micro-batches, then `commit()`."""

    def __init__(self, trainer, ask):
        self._trainer = trainer
        self.number = ask["step"]
        self.rank = ask["rank"]
        self.world = ask["world"]
        self.generation = ask["generation"]
        self.data_position = ask["data_position"]
        self.redo = ask.get("redo", False)
        self._first = ask["first"]
        self._count = ask["count"]
        self._micro = max(1, ask["micro_batch"])
        self._global = ask["global_batch"]
        self._loss_sum = 0.0
        self._samples = 0
        self._current = None
        self._committed = None
        self.loss = float("nan")

    @property
    def local_loss(self):
        """This rank's mean loss over its samples of the step."""
        return self._loss_sum / self._samples if self._samples else float("nan")

    def micro_batches(self):
        """This rank's micro-batches (possibly none): the gradient buckets are
        zeroed first, torch is seeded before each one, and the iteration stops
        early once the step was aborted (a rank was lost)."""
        t = self._trainer
        t._check_thread()
        t._begin_step()
        indices = t._indices(self.data_position, self._first, self._count)
        count = len(indices)
        first_index = self._first // self._micro
        micro_count = (count + self._micro - 1) // self._micro
        for j in range(micro_count):
            if t._superseded():
                break
            chunk = indices[j * self._micro:(j + 1) * self._micro]
            index = first_index + j
            seed = t._micro_seed(self.data_position, index)
            torch.manual_seed(seed)
            mb = MicroBatch(t, chunk, index, len(chunk) / self._global, seed)
            self._current = mb
            t._arm(j == micro_count - 1)
            yield mb
            if self._current is not None:
                raise UsageError(f"step {self.number}: micro-batch {index} ended without "
                                 "step.backward(loss); call it once per micro-batch")
        t._arm(False)

    def backward(self, loss, *, count=None):
        """Backward of this micro-batch's mean loss, scaled by its share of the
        global batch; the loss is added to the step's (count: how many samples
        or tokens it averages, default the micro-batch's samples)."""
        mb = self._current
        if mb is None:
            raise UsageError("step.backward() outside step.micro_batches(), or twice for one "
                             "micro-batch")
        self._trainer._check_thread()
        self._current = None
        (loss * mb.weight).backward()
        n = len(mb.indices) if count is None else count
        self._loss_sum += float(loss.detach()) * n
        self._samples += n

    def commit(self):
        """Waits until every rank's gradients are reduced and the coordinator
        decides. True: apply the step now (every rank does). False: it was
        aborted; `steps()` hands the same number out again."""
        self._trainer._check_thread()
        if self._committed is not None:
            return self._committed
        self._committed = self._trainer._finish(self)
        return self._committed


class Trainer:
    """Trains `model` with `optimizer` on `dataset` (map-style) under the job."""

    def __init__(self, job, model, optimizer, dataset, *, extras=None, collate_fn=None,
                 bucket_bytes=None, shuffle=True):
        if not isinstance(job, Job):
            raise UsageError("Trainer(job, ...): pass the Job that troupe.init() returned")
        self._job = job
        self._model = model
        self._optimizer = optimizer
        self._dataset = dataset
        self._extras = dict(extras or {})
        self._collate = collate_fn or torch.utils.data.default_collate
        self._shuffle = shuffle
        self._thread = threading.get_ident()
        self._session = job._session
        self._length = len(dataset)
        if self._length < 1:
            raise UsageError("the dataset is empty")
        self._params = self._check_model()
        self._layout_buckets(bucket_bytes or job.bucket_bytes or _DEFAULT_BUCKET_BYTES)
        self._install_hooks()
        # The state the script began with: a generation that starts from step 0 again (every
        # rank lost its state) begins here.
        entries, skeleton = _state.walk(model, optimizer, self._extras)
        self._initial = ({e.name: e.tensor.detach().clone() for e in entries}, skeleton)
        self._applied = False
        self._scratch = None
        self._stash = None
        self._closed = False
        self._step = None
        if self._session is not None:
            self._session.set_buckets([(b.data_ptr(), b.numel()) for b in self._buckets])

    # ---- set-up

    def _check_model(self):
        trainable = [p for p in self._model.parameters() if p.requires_grad]
        in_optimizer = {id(p) for group in self._optimizer.param_groups for p in group["params"]}
        names = {id(p): n for n, p in self._model.named_parameters()}
        for p in trainable:
            name = names.get(id(p), "?")
            if p.device.type != "cpu":
                raise UnsupportedError(
                    f"parameter {name} is on {p.device}: troupe's Python frontend trains CPU "
                    "tensors only (the NCCL data plane is not wired to jobs yet)")
            if p.is_sparse:
                raise UnsupportedError(f"parameter {name} is sparse; troupe reduces dense "
                                       "float32 gradients only")
            if p.dtype != torch.float32:
                raise UnsupportedError(f"parameter {name} is {p.dtype}; troupe reduces float32 "
                                       "gradients only")
            if id(p) not in in_optimizer:
                raise UnsupportedError(f"parameter {name} is trainable but not in the optimizer; "
                                       "give the optimizer every trainable parameter, or set "
                                       "requires_grad=False")
        for name, b in self._model.named_buffers():
            if b.device.type != "cpu":
                raise UnsupportedError(f"buffer {name} is on {b.device}: CPU tensors only")
        return trainable

    def _layout_buckets(self, bucket_bytes):
        # Last parameters first: backward finishes them first, so the first buckets are ready
        # while the rest of backward still runs.
        order = list(reversed(self._params))
        self._buckets, self._bucket_of, self._members = [], {}, []
        current, size = [], 0
        limit = max(1, bucket_bytes // 4)
        for p in order:
            if current and size + p.numel() > limit:
                self._close_bucket(current, size)
                current, size = [], 0
            current.append(p)
            size += p.numel()
        if current:
            self._close_bucket(current, size)
        self._bind_grads()

    def _close_bucket(self, params, size):
        flat = torch.zeros(size, dtype=torch.float32)
        k = len(self._buckets)
        self._buckets.append(flat)
        self._members.append(len(params))
        offset = 0
        for p in params:
            self._bucket_of[id(p)] = (k, offset)
            offset += p.numel()

    def _bind_grads(self):
        # Every gradient is a view of its bucket: autograd accumulates into the bucket's
        # memory, which the runtime reduces in place.
        for p in self._params:
            k, offset = self._bucket_of[id(p)]
            view = self._buckets[k][offset:offset + p.numel()].view_as(p)
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view

    def _install_hooks(self):
        self._armed = False
        self._fired = [0] * len(self._buckets)
        self._accumulators = []  # autograd holds them weakly; they must live as long as we do
        for p in self._params:
            k, _ = self._bucket_of[id(p)]
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook_for(k))
            self._accumulators.append(acc)

    def _hook_for(self, k):
        def fired(*_):
            if not self._armed:
                return
            self._fired[k] += 1
            if self._fired[k] == self._members[k] and self._session is not None:
                self._session.ready(k)
        return fired

    # ---- the step, as Step calls it

    def _check_thread(self):
        if threading.get_ident() != self._thread:
            raise UsageError("troupe calls must come from the thread that made the Trainer")

    def _begin_step(self):
        self._bind_grads()
        for b in self._buckets:
            b.zero_()
        self._fired = [0] * len(self._buckets)

    def _arm(self, last):
        self._armed = last

    def _superseded(self):
        return self._session is not None and self._session.superseded()

    def _indices(self, position, first, count):
        if count == 0:
            return []
        return sample_indices(self._job.seed, self._length, self._job.batch, position, first,
                              count, self._shuffle)

    def _micro_seed(self, position, index):
        return _ext().micro_batch_seed(self._job.seed, position, index)

    def _finish(self, step):
        step._trainer._armed = False
        if self._session is None:
            step.loss = step.local_loss
            self._applied = True
            return True
        self._session.reply("", step._loss_sum, step._samples)
        while True:
            kind, ask = self._session.next()
            if kind == "apply":
                step.loss = ask["loss"]
                self._pending_apply = True
                return True
            if self._serve(kind, ask):
                continue
            self._stash = (kind, ask)  # a new step (this one was aborted), or the end
            return False

    # ---- what the runtime asks between steps

    def _serve(self, kind, ask):
        """Answers a request for the state; False when `kind` is not one."""
        if kind not in ("state", "init", "begin_restore", "end_restore", "cancel_restore"):
            return False
        try:
            if kind == "state":
                self._register_state()
            elif kind == "init":
                if self._applied:  # back to the state the script began with
                    tensors, skeleton = self._initial
                    fresh = {n: t.clone() for n, t in tensors.items()}
                    _state.load(self._model, self._optimizer, self._extras,
                                _state.rebuild(skeleton, fresh))
                    self._applied = False
            elif kind == "begin_restore":
                scratch = {}
                for name, array, role, dtype, shape in ask["tensors"]:
                    scratch[name] = (array, role, torch.empty(shape, dtype=_state.torch_dtype(dtype)))
                self._scratch = (scratch, ask["extras"])
            elif kind == "end_restore":
                scratch, skeleton = self._scratch
                self._scratch = None
                tree = _state.rebuild(skeleton, {n: t for n, (_, _, t) in scratch.items()})
                _state.load(self._model, self._optimizer, self._extras, tree)
                self._applied = True
                self._bind_grads()
            elif kind == "cancel_restore":
                self._scratch = None
        except Exception as e:  # the runtime reports it; the job decides
            self._session.reply(f"{kind} failed: {type(e).__name__}: {e}")
            return True
        self._session.reply()
        return True

    def _register_state(self):
        roles = {"parameter": 0, "optimizer": 1, "buffer": 2, "extra": 3}
        if self._scratch is not None:
            scratch, skeleton = self._scratch
            entries = [(n, a, r, t) for n, (a, r, t) in scratch.items()]
        else:
            walked, skeleton = _state.walk(self._model, self._optimizer, self._extras)
            entries = [(e.name, e.array, roles[e.role], e.tensor) for e in walked]
        self._session.set_state(
            [(n, a, r if isinstance(r, int) else roles[r], _state.dtype_name(t.dtype),
              list(t.shape), t.data_ptr()) for n, a, r, t in entries], skeleton)

    # ---- the loop

    def steps(self):
        """This session's steps, in order; a step that was aborted comes again
        with the same number. Returns after the last step; raises
        troupe.Stopped when the job ends otherwise."""
        self._check_thread()
        if self._session is None:
            yield from self._steps_alone()
            return
        self._pending_apply = False
        last = None
        while True:
            if self._pending_apply:  # the script applied the last step: say so
                self._pending_apply = False
                self._applied = True
                self._session.reply()
            elif last is not None and last._committed is None:
                raise UsageError(f"step {last.number} was neither committed nor abandoned: call "
                                 "step.commit() before asking for the next step")
            kind, ask = self._stash if self._stash else self._session.next()
            self._stash = None
            if self._serve(kind, ask):
                continue
            if kind == "step":
                ask = dict(ask)
                ask["redo"] = last is not None and ask["step"] <= last.number
                last = Step(self, ask)
                self._step = last
                self._job.rank_zero = last.rank == 0
                yield last
                continue
            if kind == "ended":
                if ask["finished"]:
                    self._session.wait_end(60.0)
                    return
                raise Stopped(ask["code"], ask["why"] or "the job stopped")
            raise UsageError(f"unexpected request {kind!r} from the runtime")

    def _steps_alone(self):
        for number in range(1, self._job.last_step + 1):
            step = Step(self, {"step": number, "rank": 0, "world": 1, "generation": 0,
                               "data_position": number - 1, "first": 0,
                               "count": self._job.batch, "micro_batch": self._job.micro_batch,
                               "global_batch": self._job.batch})
            self._step = step
            yield step
            if step._committed is None:
                raise UsageError(f"step {number} was not committed: call step.commit() before "
                                 "asking for the next step")

    # ---- the end

    def close(self, error=None):
        """Leaves the job. With `error`, tells the job why this process failed."""
        if self._closed:
            return
        self._closed = True
        if self._session is None:
            return
        if error is not None:
            self._session.fail(error)
            self._session.wait_end(10.0)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None or issubclass(kind, Stopped):
            self.close()
            return False
        at = f" in step {self._step.number}" if self._step is not None else ""
        text = "".join(traceback.format_exception(kind, value, tb))
        self.close(f"the script raised{at}:\n{text}")
        return False

