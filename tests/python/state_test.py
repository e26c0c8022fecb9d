"""The state walk of a Python job (python/troupe/_state.py): a checkpoint's
tensors are the live ones, and walk -> bytes -> rebuild -> load resumes
training bit for bit.

Run: PYTHONPATH=python /usr/bin/python3 tests/python/state_test.py
Exits 77 (skipped) where torch cannot be imported."""

import json
import math
import sys
import unittest

try:
    import torch
    from torch import nn
except ImportError:
    print("torch cannot be imported: skipped")
    sys.exit(77)

from troupe import _state
from troupe._errors import StateError, Stopped, UnsupportedError, UsageError


class Net(nn.Module):
    """An embedding, a linear layer and a batch norm: parameters, float
    buffers and an int64 buffer (num_batches_tracked)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 1)

    def forward(self, idx):
        return self.out(torch.tanh(self.bn(self.fc(self.emb(idx)))))


def build(seed):
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    return model, optimizer, schedule


def train(model, optimizer, schedule, step):
    # The data depend only on the step number, so two runs see the same.
    g = torch.Generator().manual_seed(1000 + step)
    idx = torch.randint(0, 10, (16,), generator=g)
    y = torch.randn(16, 1, generator=g)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(idx), y).backward()
    optimizer.step()
    schedule.step()


def copy_bytes(entries):
    """What a checkpoint round trip does: each tensor's bytes into a fresh
    tensor of the recorded dtype and shape."""
    out = {}
    for e in entries:
        dtype = _state.torch_dtype(_state.dtype_name(e.tensor.dtype))
        fresh = torch.empty(e.tensor.shape, dtype=dtype)
        fresh.reshape(-1).view(torch.uint8).copy_(e.tensor.reshape(-1).view(torch.uint8))
        out[e.name] = fresh
    return out


class Extra:
    """A script's own state object."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


class RoundTrip(unittest.TestCase):
    def test_resume_is_bitwise(self):
        a = build(1)
        for step in range(2):
            train(*a, step)
        entries, skeleton = _state.walk(a[0], a[1], {"schedule": a[2]})
        tensors = copy_bytes(entries)

        b = build(2)
        self.assertFalse(torch.equal(a[0].fc.weight, b[0].fc.weight))
        _state.load(b[0], b[1], {"schedule": b[2]}, _state.rebuild(skeleton, tensors))

        for step in range(2, 5):
            train(*a, step)
            train(*b, step)
        for (name, x), (_, y) in zip(a[0].state_dict().items(), b[0].state_dict().items()):
            self.assertTrue(torch.equal(x, y), name)
        for p, q in zip(a[0].parameters(), b[0].parameters()):
            for key in a[1].state[p]:
                self.assertTrue(torch.equal(a[1].state[p][key], b[1].state[q][key]), key)
        self.assertEqual(a[2].state_dict(), b[2].state_dict())
        self.assertEqual(a[1].param_groups[0]["lr"], b[1].param_groups[0]["lr"])

    def test_entries_are_the_live_tensors(self):
        model, optimizer, schedule = build(1)
        train(model, optimizer, schedule, 0)
        entries, _ = _state.walk(model, optimizer, {"schedule": schedule})
        by_name = {e.name: e for e in entries}

        for name, p in model.named_parameters():
            e = by_name[f"model/{name}"]
            self.assertEqual((e.array, e.role), ("model", "parameter"))
            self.assertEqual(e.tensor.data_ptr(), p.data_ptr(), name)
        for name, b in model.named_buffers():
            e = by_name[f"model/{name}"]
            self.assertEqual((e.array, e.role), ("model", "buffer"))
            self.assertEqual(e.tensor.data_ptr(), b.data_ptr(), name)
        self.assertEqual(by_name["model/bn.num_batches_tracked"].tensor.dtype, torch.int64)

        for index, p in enumerate(model.parameters()):
            for key, value in optimizer.state[p].items():
                e = by_name[f"optim/state/{index}/{key}"]
                self.assertEqual((e.array, e.role), ("optim", "optimizer"))
                self.assertEqual(e.tensor.data_ptr(), value.data_ptr(), e.name)
        # torch 1.13 keeps Adam's step count as a tensor, so it travels as one.
        self.assertIn("optim/state/0/step", by_name)

        # A write through the model shows through the entry: no copy anywhere.
        with torch.no_grad():
            model.fc.bias.fill_(3.5)
        self.assertTrue(torch.all(by_name["model/fc.bias"].tensor == 3.5))

    def test_skeleton_is_deterministic(self):
        model, optimizer, schedule = build(1)
        train(model, optimizer, schedule, 0)
        _, first = _state.walk(model, optimizer, {"schedule": schedule})
        _, second = _state.walk(model, optimizer, {"schedule": schedule})
        self.assertEqual(first, second)
        self.assertNotIn(" ", first)
        tree = json.loads(first)
        self.assertEqual(list(tree), ["model", "optim", "extras"])
        self.assertEqual(tree["model"]["fc.weight"], {"$t": "tensor", "name": "model/fc.weight"})
        # The optimizer's parameter indices are ints: a tagged dict.
        self.assertEqual(tree["optim"]["state"]["$t"], "dict")
        self.assertEqual(tree["optim"]["state"]["k"][:2], [0, 1])


class Leaves(unittest.TestCase):
    def test_adam_betas_and_nonfinite_floats(self):
        model = nn.Linear(2, 1)
        optimizer = torch.optim.Adam(model.parameters(), betas=(0.8, 0.95))
        odd = Extra({"best": math.inf, "worst": -math.inf, "last": math.nan,
                     "nested": (1, (2.5, "x"), [None, True]), 3: "int key",
                     "$t": "a key that looks like a tag", (1, 2): "tuple key"})
        entries, skeleton = _state.walk(model, optimizer, {"odd": odd})
        tree = _state.rebuild(skeleton, copy_bytes(entries))

        self.assertEqual(tree["optim"]["param_groups"][0]["betas"], (0.8, 0.95))
        self.assertIsInstance(tree["optim"]["param_groups"][0]["betas"], tuple)
        got = tree["extras"]["odd"]
        self.assertEqual(got["best"], math.inf)
        self.assertEqual(got["worst"], -math.inf)
        self.assertTrue(math.isnan(got["last"]))
        self.assertEqual(got["nested"], (1, (2.5, "x"), [None, True]))
        self.assertIsInstance(got["nested"][1], tuple)
        self.assertEqual(got[3], "int key")
        self.assertEqual(got["$t"], "a key that looks like a tag")
        self.assertEqual(got[(1, 2)], "tuple key")
        self.assertEqual(list(got), list(odd.state))

        fresh_opt = torch.optim.Adam(nn.Linear(2, 1).parameters())
        _state.load(nn.Linear(2, 1), fresh_opt, {"odd": Extra(None)}, tree)
        self.assertEqual(fresh_opt.param_groups[0]["betas"], (0.8, 0.95))

    def test_names_with_slash_and_percent_are_encoded(self):
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        extra = Extra({"a/b%c": torch.ones(2), "plain": torch.zeros(1)})
        entries, skeleton = _state.walk(model, optimizer, {"x/y": extra})
        names = {e.name for e in entries}
        self.assertIn("extras/x%2Fy/a%2Fb%25c", names)
        self.assertIn("extras/x%2Fy/plain", names)
        tree = _state.rebuild(skeleton, copy_bytes(entries))
        self.assertTrue(torch.equal(tree["extras"]["x/y"]["a/b%c"], torch.ones(2)))

    def test_int_dtypes_and_scalars_round_trip(self):
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        values = {"i8": torch.tensor([-3, 4], dtype=torch.int8),
                  "flag": torch.tensor(True),
                  "half": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                  "count": torch.tensor(2**40)}
        entries, skeleton = _state.walk(model, optimizer, {"v": Extra(values)})
        tree = _state.rebuild(skeleton, copy_bytes(entries))
        for key, value in values.items():
            got = tree["extras"]["v"][key]
            self.assertEqual(got.dtype, value.dtype, key)
            self.assertTrue(torch.equal(got, value), key)
        self.assertEqual({e.role for e in entries if e.array == "extra"}, {"extra"})


class Refusals(unittest.TestCase):
    def walk_extra(self, state, name="schedule"):
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return _state.walk(model, optimizer, {name: Extra(state)})

    def test_lambda_in_a_scheduler_is_named_by_path(self):
        class Warmup:
            # LambdaLR saves a callable object's __dict__, lambda included.
            def __init__(self):
                self.fn = lambda epoch: min(1.0, (epoch + 1) / 10)

            def __call__(self, epoch):
                return self.fn(epoch)

        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, Warmup())
        with self.assertRaises(StateError) as caught:
            _state.walk(model, optimizer, {"schedule": schedule})
        self.assertEqual(str(caught.exception),
                         "extras/schedule/lr_lambdas/0/fn: a function cannot be "
                         "checkpointed; keep the state in numbers or tensors")

    def test_plain_lambda_is_left_out_by_torch(self):
        # torch's LambdaLR.state_dict() writes None for a plain function, so
        # there is nothing to refuse: the script recreates it on restart.
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5)
        _, skeleton = _state.walk(model, optimizer, {"schedule": schedule})
        self.assertEqual(json.loads(skeleton)["extras"]["schedule"]["lr_lambdas"], [None])

    def test_function_and_object_leaves(self):
        with self.assertRaisesRegex(StateError, r"^extras/schedule/hook: a function"):
            self.walk_extra({"hook": lambda: 0})
        with self.assertRaisesRegex(StateError, r"^extras/schedule/0/x: a function"):
            self.walk_extra([{"x": len}])
        with self.assertRaisesRegex(StateError, r"^extras/schedule/when: a .*object"):
            self.walk_extra({"when": object()})
        with self.assertRaisesRegex(StateError, r"^extras/schedule/dtype: "):
            self.walk_extra({"dtype": torch.float32})

    def test_noncontiguous_buffer(self):
        model = nn.Linear(2, 1)
        model.register_buffer("table", torch.zeros(3, 4).t())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaisesRegex(StateError, r"^model/table: a non-contiguous tensor"):
            _state.walk(model, optimizer, {})

    def test_sparse_and_unsupported_dtype(self):
        sparse = torch.zeros(2, 2).to_sparse()
        with self.assertRaisesRegex(StateError, r"^extras/s/m: a torch.sparse_coo tensor"):
            self.walk_extra({"m": sparse}, name="s")
        with self.assertRaisesRegex(StateError, r"^extras/s/c: a torch.complex64 tensor"):
            self.walk_extra({"c": torch.zeros(2, dtype=torch.complex64)}, name="s")

    def test_keys_that_collide_as_text(self):
        with self.assertRaisesRegex(StateError, r"^extras/s/1: two leaves"):
            self.walk_extra({1: torch.ones(1), "1": torch.ones(1)}, name="s")

    def test_missing_tensor_and_mismatched_extras(self):
        entries, skeleton = self.walk_extra({"t": torch.ones(1)}, name="s")
        tensors = copy_bytes(entries)
        del tensors["extras/s/t"]
        with self.assertRaisesRegex(StateError, r"^extras/s/t: "):
            _state.rebuild(skeleton, tensors)
        tree = _state.rebuild(skeleton, copy_bytes(entries))
        model = nn.Linear(2, 1)
        with self.assertRaisesRegex(StateError, "extras differ"):
            _state.load(model, torch.optim.SGD(model.parameters(), lr=0.1), {}, tree)

    def test_dtype_names(self):
        for name in "f32 f64 f16 bf16 i64 i32 i16 i8 u8 bool".split():
            self.assertEqual(_state.dtype_name(_state.torch_dtype(name)), name)
        with self.assertRaises(StateError):
            _state.dtype_name(torch.complex64)
        with self.assertRaises(StateError):
            _state.torch_dtype("f8")


class Errors(unittest.TestCase):
    def test_hierarchy(self):
        stopped = Stopped(3, "the loss diverged")
        self.assertIsInstance(stopped, SystemExit)
        self.assertEqual((stopped.code, stopped.reason), (3, "the loss diverged"))
        self.assertTrue(issubclass(StateError, RuntimeError))
        self.assertTrue(issubclass(UsageError, RuntimeError))
        self.assertTrue(issubclass(UnsupportedError, TypeError))


if __name__ == "__main__":
    unittest.main()
