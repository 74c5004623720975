"""Weight hand-off from trainer to generator: WeightStore (shared memory) against the usual paths.

For the tiny model and a ~100M-parameter random Qwen3 it measures, in one run:

- ``WeightStore``: ``put`` (trainer side: one write into /dev/shm), then either ``get`` + the
  generator's ``load_state_dict`` (zero-copy mmap views copied into the live model),
  ``load_into(model)`` (the file read straight into the parameters' memory) or
  ``load_shared(model)`` (the generator adopts the mmap views as its parameters: no copy on the
  pull side, only the page faults of first use, which the pull time here includes; what
  ``HFGenerator.update_weights`` does with a ``WeightStore`` source);
- safetensors files in /dev/shm (the baseline): ``save_file`` then ``load_file`` + ``load_state_dict``;
- ``WeightStore(backend="ring")``: the same pulls on pre-faulted slots reused across versions (the
  push is one copy into pages that already exist), with the 64-bit checksum taken on push and checked
  on pull, and without it (``checksum=False``: the lock protocol alone);
- in-memory copy: ``copy_`` of every tensor into a second model (the floor: no hand-off at all).

The row marked ``[loop default]`` is the training loop's default hand-off (:func:`loop_default_row`, read
from the loop's own defaults: ``generator.weight_transport: auto`` with the generators on the trainer's host
is a ``ring`` ``WeightStore`` with its checksum, ``agents.train.components.WEIGHT_TRANSPORTS``; the trainer
pushes into it and an HF generator on the CPU adopts the version's views, as ``load_shared`` does, after the
store checked the checksum). A generator on a GPU copies the version in instead (the ``get+load`` row, plus
the copy to the device).

It prints the CPU model, median push, pull and push+pull times over ``--repeats`` runs, throughput
in GB/s (state-dict bytes / push+pull time), the speed-up over the safetensors baseline and the
ratio to the in-memory copy floor (``of floor``: floor time / path time, 1.0 = at the floor). It also
prints ``lscpu``'s model name and the load average: on a shared machine the figures move with the load.

    python -m benchmarks.weight_sync_bench [--repeats 5] [--skip-large] [--skip-relay | --only-relay] [--sequential]

``relay over Monarch``: the cross-host path on this machine (a ring push, and a pull in chunks over
Monarch from a ``WeightServer`` process into this process's own ring, then adoption), once per transport:
RDMA buffers (on a machine without ibverbs, Monarch's TCP fallback) and actor messages. The pull is started
before the push (as a generator host told the version ahead would) and runs alongside it, following what
the push has written: ``push ms`` is the push, ``pull ms`` what the pull took after the push returned,
``total ms`` the end to end time (push start to the version adopted on the other host), ``GB/s`` bytes
over it. ``--sequential`` adds rows with the pull started only after the push returned (push + pull),
whose ``transfer GB/s`` is the pull alone (what the link carries). ``CPU-s/GB`` columns: CPU time per GB
of the push (the pushing thread), of the pulling process apart from the push (until the version is
complete there; adoption not included), and of the server's process: what the transfer costs whatever
else runs on the machine, so comparable across runs on a loaded machine where the times are not. ``--only-relay`` runs just these rows.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def tiny_model(seed: int) -> torch.nn.Module:
    from forge_env.models import build_tiny_model

    return build_tiny_model(seed)


def qwen3_100m(seed: int) -> torch.nn.Module:
    """A random Qwen3 of ~100M parameters (hidden 768, 12 layers, vocab 32k, untied)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=32000, hidden_size=768, intermediate_size=1536, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config).eval()


_versions = iter(range(1 << 30))


def touch_every_page(model: torch.nn.Module) -> None:
    """Read one element per 4 KiB page of every parameter (maps a freshly adopted mmap view's pages)."""
    for tensor in model.state_dict().values():
        flat = tensor.reshape(-1)
        if flat.numel():
            flat[:: max(1, 4096 // tensor.element_size())].sum()


def median_times(fn: Callable[[int], tuple[float, float]], repeats: int) -> tuple[float, float]:
    """Median (push, pull) seconds; each run gets a new, increasing version number."""
    runs = [fn(next(_versions)) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


#: What marks the row of the training loop's default hand-off.
DEFAULT_MARK = " [loop default]"


def loop_default_row() -> str:
    """The row label of the GRPO loop's default weight hand-off, from the loop's own defaults (the resolved
    ``generator.weight_transport``, its ``WeightStore`` backend and the store's ``checksum`` default)."""
    import inspect

    from agents.train.components import WEIGHT_TRANSPORTS
    from agents.train.config import GRPOConfig
    from forge_env.weights import WeightStore

    backend, _ = WEIGHT_TRANSPORTS[GRPOConfig().generator.resolved_weight_transport()]
    checksum = inspect.signature(WeightStore).parameters["checksum"].default
    if backend == "ring":
        return "ring load_shared (checksum)" if checksum else "ring load_shared"
    return "WeightStore load_shared"


def bench_model(name: str, build: Callable[[int], torch.nn.Module], repeats: int) -> None:
    from safetensors.torch import load_file, save_file

    from forge_env.weights import WeightStore

    trainer_model, generator_model, adopting_model = build(0), build(1), build(2)
    state = {k: v.detach() for k, v in trainer_model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    # safetensors refuses tensors sharing storage (tied embeddings): give it private copies, made untimed.
    seen: set[int] = set()
    file_state = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr()
        file_state[k] = v.clone() if ptr in seen else v.contiguous()
        seen.add(ptr)
    params = sum(p.numel() for p in trainer_model.parameters())
    tmp = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None, prefix="weight-bench-"))
    store = WeightStore("bench", root=tmp / "store", keep_versions=2)
    ring = WeightStore("bench-ring", backend="ring", root=tmp / "ring", keep_versions=2)
    ring_fast = WeightStore("bench-ring-fast", backend="ring", root=tmp / "ring-fast", keep_versions=2,
                            checksum=False)

    def ring_get_load(target: WeightStore) -> Callable[[int], tuple[float, float]]:
        def run(i: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            target.put(state, i)
            t1 = time.perf_counter()
            loaded, _ = target.get(i)
            generator_model.load_state_dict(loaded)
            del loaded
            return t1 - t0, time.perf_counter() - t1
        return run

    def ring_shared(target: WeightStore) -> Callable[[int], tuple[float, float]]:
        def run(i: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            target.put(state, i)
            t1 = time.perf_counter()
            target.load_shared(adopting_model, i)
            touch_every_page(adopting_model)
            return t1 - t0, time.perf_counter() - t1
        return run

    def via_store(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        store.put(state, i)
        t1 = time.perf_counter()
        loaded, _ = store.get(i)
        generator_model.load_state_dict(loaded)
        return t1 - t0, time.perf_counter() - t1

    def via_store_load_into(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        store.put(state, i)
        t1 = time.perf_counter()
        store.load_into(generator_model, i)
        return t1 - t0, time.perf_counter() - t1

    def via_store_load_shared(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        store.put(state, i)
        t1 = time.perf_counter()
        store.load_shared(adopting_model, i)
        touch_every_page(adopting_model)  # the page faults a first forward pass would pay, counted here
        return t1 - t0, time.perf_counter() - t1

    def via_safetensors(i: int) -> tuple[float, float]:
        path = str(tmp / f"baseline-{i}.safetensors")
        t0 = time.perf_counter()
        save_file(file_state, path)
        t1 = time.perf_counter()
        generator_model.load_state_dict(load_file(path))
        elapsed = time.perf_counter() - t1
        Path(path).unlink()
        return t1 - t0, elapsed

    def via_copy(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        generator_model.load_state_dict(state)
        return 0.0, time.perf_counter() - t0

    try:
        via_store(next(_versions))  # warm-up: the allocator and the first /dev/shm file
        for target in (ring, ring_fast):  # the ring's slots are made (allocated, faulted) once, not per push
            for _ in range(3):
                ring_shared(target)(next(_versions))
        results = {
            "safetensors (baseline)": median_times(via_safetensors, repeats),
            "WeightStore get+load": median_times(via_store, repeats),
            "WeightStore load_into": median_times(via_store_load_into, repeats),
            "WeightStore load_shared": median_times(via_store_load_shared, repeats),
            "ring get+load (checksum)": median_times(ring_get_load(ring), repeats),
            "ring load_shared (checksum)": median_times(ring_shared(ring), repeats),
            "ring get+load": median_times(ring_get_load(ring_fast), repeats),
            "ring load_shared": median_times(ring_shared(ring_fast), repeats),
            "in-memory copy (floor)": median_times(via_copy, repeats),
        }
    finally:
        store.clear()
        ring.clear()
        ring_fast.clear()
        for leftover in tmp.glob("*"):
            leftover.unlink()
        tmp.rmdir()

    base = sum(results["safetensors (baseline)"])
    floor = sum(results["in-memory copy (floor)"])
    default = loop_default_row()
    print(f"\n{name}: {params / 1e6:.1f}M parameters, {nbytes / 1e6:.1f} MB state dict (fp32), median of {repeats}")
    print(f"  {'path':<42} {'push ms':>9} {'pull ms':>9} {'total ms':>9} {'GB/s':>7} {'vs baseline':>12} "
          f"{'of floor':>9}")
    for label, (push, pull) in results.items():
        total = push + pull
        label += DEFAULT_MARK if label == default else ""
        print(
            f"  {label:<42} {push * 1e3:9.1f} {pull * 1e3:9.1f} {total * 1e3:9.1f} "
            f"{nbytes / total / 1e9:7.2f} {base / total:11.2f}x {floor / total:9.2f}"
        )


def bench_relay(name: str, build: Callable[[int], torch.nn.Module], repeats: int, sequential: bool = False) -> None:
    """The cross-host path on this machine: a ring push and, alongside it, a pull over Monarch from a
    ``WeightServer`` process into this process's own ring (what a generator host does), then adoption; per
    transport (RDMA buffers, here Monarch's TCP fallback, and actor messages), with CPU time per GB."""
    import asyncio
    import threading

    from forge_env.weights import WeightStore
    from forge_env.weights.relay import RemoteWeightSource, spawn_weight_server
    from forge_env.weights.relay_server import rdma_backend

    trainer_model, adopting_model = build(0), build(2)
    state = {k: v.detach() for k, v in trainer_model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    tmp = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None, prefix="relay-bench-"))
    store = WeightStore("relay-bench", backend="ring", root=tmp / "trainer")
    server, procs = asyncio.run(spawn_weight_server(store))
    transports = ["rdma", "messages"] if rdma_backend() != "none" else ["messages"]
    sources = {t: RemoteWeightSource(server, f"relay-bench-{t}", host_key=lambda: "bench-host",
                                     root_base=str(tmp / "hosts"), transport=t, wait_s=60.0) for t in transports}
    pulls: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float, float]]] = {}  # label -> (push, pulling process, server) CPU-s

    def floor(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        adopting_model.load_state_dict(state)
        return 0.0, time.perf_counter() - t0

    def relay(transport: str, overlap: bool, label: str) -> Callable[[int], tuple[float, float]]:
        source = sources[transport]

        def run(i: int) -> tuple[float, float]:
            failed: list[BaseException] = []

            def pull() -> None:
                try:
                    source._ensure(i)
                except BaseException as e:  # noqa: BLE001 - reported below, in the benchmark's thread
                    failed.append(e)

            server_cpu0 = server.cpu_seconds.call_one().get()
            cpu0, t0 = time.process_time(), time.perf_counter()
            thread = threading.Thread(target=pull)
            if overlap:
                thread.start()
            push_cpu0 = time.thread_time()
            store.put(state, i)
            push_cpu, t1 = time.thread_time() - push_cpu0, time.perf_counter()
            if not overlap:
                thread.start()
            thread.join()
            if failed:
                raise failed[0]
            t2, cpu_total = time.perf_counter(), time.process_time() - cpu0
            pulls.setdefault(label, []).append(t2 - (t0 if overlap else t1))
            # As a generator's source.get does: the pull checked the checksum as the chunks landed.
            sources[transport].local_store().load_shared(adopting_model, i, verify=False)
            touch_every_page(adopting_model)
            elapsed = time.perf_counter() - t1
            server_cpu = server.cpu_seconds.call_one().get() - server_cpu0  # the transfer (adoption is not)
            cpu.setdefault(label, []).append((push_cpu, cpu_total - push_cpu, server_cpu))
            return t1 - t0, elapsed
        return run

    rows = [(t, True, f"relay over Monarch ({t})") for t in transports]
    rows += [(t, False, f"relay, push then pull ({t})") for t in transports] if sequential else []
    try:
        for transport, overlap, label in rows:
            for _ in range(2):
                relay(transport, overlap, label)(next(_versions))  # warm-up: slots on both sides, the server
            pulls.pop(label, None)
            cpu.pop(label, None)
        results = {label: median_times(relay(t, overlap, label), repeats) for t, overlap, label in rows}
        results["in-memory copy (floor)"] = median_times(floor, repeats)
    finally:
        store.clear()
        for source in sources.values():
            source.local_store().clear()
        procs.stop().get()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    floor_s = sum(results["in-memory copy (floor)"])
    chunk = next(iter(sources.values())).chunk_bytes >> 20
    print(f"\n{name}, cross-host path on one machine (chunks of {chunk} MiB; RDMA backend: {rdma_backend()}), "
          f"median of {repeats}")
    print(f"  {'path':<32} {'push ms':>8} {'pull ms':>8} {'total ms':>9} {'GB/s':>6} {'transfer GB/s':>14} "
          f"{'of floor':>9}  {'CPU-s/GB push':>13} {'pull side':>9} {'server':>7}")
    for label, (push, pull) in results.items():
        total = push + pull
        transfer, cpus = "", ""
        if label in pulls and not label.startswith("relay over"):
            transfer = f"{nbytes / statistics.median(pulls[label]) / 1e9:.2f}"
        if label in cpu:
            per_gb = [statistics.median(c[k] for c in cpu[label]) / (nbytes / 1e9) for k in range(3)]
            cpus = f"{per_gb[0]:13.2f} {per_gb[1]:9.2f} {per_gb[2]:7.2f}"
        print(f"  {label:<32} {push * 1e3:8.1f} {pull * 1e3:8.1f} {total * 1e3:9.1f} "
              f"{nbytes / total / 1e9:6.2f} {transfer:>14} {floor_s / total:9.2f}  {cpus}")


def cpu_model() -> str:
    """``lscpu``'s Model name (or /proc/cpuinfo's model name where lscpu is missing)."""
    import subprocess

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for line in out.splitlines():
        if line.lower().startswith(("model name", "model name\t")):
            return line.split(":", 1)[1].strip()
    return "unknown"


def load_average() -> str:
    """The 1/5/15-minute load average (what ``uptime`` prints), for labelling the figures."""
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-large", action="store_true", help="only the tiny model")
    parser.add_argument("--skip-relay", action="store_true", help="not the cross-host path over Monarch")
    parser.add_argument("--only-relay", action="store_true", help="only the cross-host path over Monarch")
    parser.add_argument("--sequential", action="store_true",
                        help="also relay rows with the pull started after the push returned (and the pull's GB/s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (1 keeps parallel copies from stalling on a loaded machine)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    from forge_env.utils.machine import describe_machine

    print(f"machine: {describe_machine()}; torch threads: {torch.get_num_threads()}")
    print(f"cpu: {cpu_model()}; load: {load_average()}")
    if not args.only_relay:
        bench_model("tiny model (forge_env.models)", tiny_model, args.repeats)
        if not args.skip_large:
            bench_model("random Qwen3 ~100M", qwen3_100m, args.repeats)
    if not args.skip_relay:
        bench_relay("tiny model (forge_env.models)", tiny_model, args.repeats, args.sequential)
        if not args.skip_large:
            bench_relay("random Qwen3 ~100M", qwen3_100m, args.repeats, args.sequential)
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
