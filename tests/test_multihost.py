"""Two real processes on 127.0.0.1 (jax.distributed + gloo, 4 CPU devices each)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj

pytestmark = pytest.mark.multihost  # real processes on 127.0.0.1, jax.distributed

WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")


def run_workers(argv_of, timeout):
  """Two worker processes (``argv_of(i)`` after the interpreter), run to the end: their exit
  codes and output; a worker still running at ``timeout`` is killed."""
  procs = [
    subprocess.Popen(
      [sys.executable, *map(str, argv_of(i))],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  logs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=timeout)
      logs.append(out)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs], logs


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_restore_their_halves_and_step_like_one(tmp_path):
  rng = np.random.default_rng(0)
  fused = rng.standard_normal((128, 16)).astype(np.float32)
  w = rng.standard_normal((128, 16)).astype(np.float32)
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("x",))
  rows = NamedSharding(mesh, P("x", None))
  tree = {"fused": jax.device_put(fused, rows), "w": jax.device_put(w, rows)}
  # 8-row storage chunks, so every device's region is whole chunks (physical reads = its bytes)
  save_args = {k: ocp.SaveArgs(chunk_byte_size=8 * 16 * 4) for k in tree}
  ocp.Checkpointer(ocp.StandardCheckpointHandler()).save(
    tmp_path / "ckpt", args=ocp.args.StandardSave(tree, save_args=save_args)
  )
  # the single-process reference: same restore, same keyed step, on 8 local devices
  params = {
    "a": jax.device_put(fused[:64], rows),
    "b": jax.device_put(fused[64:], rows),
    "w": jax.device_put(w, rows),
  }
  tx = prj.keyed(optax.adam(1e-2))

  @jax.jit
  def step(params, state):
    grads = jax.tree.map(jnp.sin, params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  stepped, _ = step(params, tx.init(params))
  ref = {f"param_{k}": np.asarray(v) for k, v in params.items()} | {
    f"step_{k}": np.asarray(v) for k, v in stepped.items()
  }
  np.savez(tmp_path / "ref.npz", **ref)

  port = free_port()
  codes, logs = run_workers(
    lambda i: [
      WORKER,
      str(i),
      str(port),
      str(tmp_path / "ckpt"),
      str(tmp_path / "ref.npz"),
      str(tmp_path / f"out{i}.json"),
    ],
    timeout=120,
  )
  assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
  results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
  total = fused.nbytes + w.nbytes
  for r in results:
    assert r["checked"] == 2 * 3 * 4  # 3 params x 4 local shards, restored and stepped
    assert r["bytes_read"] == total // 2, r  # each process read exactly its own half


EXPORT_WORKER = pathlib.Path(__file__).with_name("multihost_export_worker.py")


def test_two_processes_export_their_tensors_like_one_host(tmp_path):
  """Each process writes the tensors it owns (the bytes it lacks gathered one piece at a time);
  the files equal a single-host export byte for byte, and no process holds the model."""
  import multihost_export_model as model

  src, target, recipes = model.setup()
  params = model.trained(prj.restore(target, src, recipes=recipes))
  prj.export(params, recipes, tmp_path / "one", source=src, max_shard_bytes=model.SHARD_BYTES)
  port = free_port()
  codes, logs = run_workers(
    lambda i: [
      EXPORT_WORKER,
      str(i),
      str(port),
      str(tmp_path / "two"),
      str(tmp_path / f"r{i}.json"),
    ],
    timeout=300,
  )
  assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
  one = {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()}
  for out in ("two", "two-again"):
    two = {p.name: p.read_bytes() for p in (tmp_path / out).iterdir()}
    assert sorted(one) == sorted(two) and len(one) > 2, sorted(two)  # shards and an index
    for name in one:
      assert one[name] == two[name], (out, name)
  for i in range(2):
    r = json.loads((tmp_path / f"r{i}.json").read_text())
    assert r["growth"] <= 0.6 * r["model"], r


KILL_WORKER = pathlib.Path(__file__).with_name("multihost_export_kill_worker.py")


@pytest.mark.parametrize("mode", ["kill", "fail"])
def test_an_export_whose_peer_dies_or_fails_leaves_the_old_copy_and_nothing_else(tmp_path, mode):
  """A peer killed mid-export (its collectives break off) or a process that fails writing:
  every live process raises an ExportError naming itself, no staged file is left, and the
  previous copy is byte-identical."""
  import multihost_export_model as model

  src, target, recipes = model.setup()
  params = model.trained(prj.restore(target, src, recipes=recipes))
  final = tmp_path / "out"
  prj.export(params, recipes, final, source=src, max_shard_bytes=model.SHARD_BYTES)
  before = {p.name: p.read_bytes() for p in final.iterdir()}
  port = free_port()
  _, logs = run_workers(
    lambda i: [
      KILL_WORKER,
      str(i),
      str(port),
      str(final),
      str(tmp_path / f"r{i}.json"),
      mode,
    ],
    timeout=240,
  )
  log = "\n\n".join(text[-3000:] for text in logs)
  alive = [0] if mode == "kill" else [0, 1]
  for i in alive:
    outcome = json.loads((tmp_path / f"r{i}.json").read_text())
    assert outcome["raised"] == "ExportError", (outcome, log)
    assert str(final) in outcome["message"] and "nothing" in outcome["message"], outcome
    if mode == "kill":
      assert "process 0 of 2" in outcome["message"], outcome
  assert sorted(os.listdir(tmp_path)) == ["out", *(f"r{i}.json" for i in alive)], log
  assert {p.name: p.read_bytes() for p in final.iterdir()} == before
