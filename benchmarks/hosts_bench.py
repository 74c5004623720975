"""Cross-host overhead of an EnvService: replicas on this host vs on 1 and 2 hosts of a Monarch job.

The "hosts" are ``ProcessJob`` workers on this machine (the same cores), so this measures what
placing replicas through host meshes costs, not a speed-up: more hosts only pay off on a cluster,
where each host brings its own cores. One step is a calculator tool call in
``forge_env/Arithmetic-v0``; each configuration runs 2 replicas and is timed at 1, 16 and 128
concurrent episodes, in rounds that alternate the configurations so machine load hits them alike.

    python -m benchmarks.hosts_bench [--total-steps 4000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from benchmarks.env_service_bench import ENV_ID, ENV_KWARGS, throughput
from forge_env.services import EnvService, placement


async def main(total_steps: int, rounds: int, concurrency: list[int]) -> None:
    from monarch.job import ProcessJob

    jobs = {hosts: ProcessJob({"cpu": hosts}) for hosts in (1, 2)}
    for hosts, job in jobs.items():
        placement.register_hosts(f"cpu{hosts}", job.state(cached_path=None).cpu)
    layouts = {"this host": None, "1 job host": "cpu1", "2 job hosts": "cpu2"}
    services: dict[str, EnvService] = {}
    try:
        for name, hosts in layouts.items():
            services[name] = await EnvService.launch(ENV_ID, num_replicas=2, env_kwargs=ENV_KWARGS,
                                                     max_episodes_per_replica=max(concurrency), hosts=hosts)
            print(f"{name:12s}: replicas on {services[name].service.replica_hosts()}")
        rates: dict[tuple[str, int], list[float]] = {}
        for _ in range(rounds):
            for sessions in concurrency:
                per_session = max(total_steps // sessions, 10)
                for name, service in services.items():
                    rates.setdefault((name, sessions), []).append(await throughput(service.env, sessions, per_session))
        print(f"\nEnvService steps/s, 2 replicas ({total_steps} steps per cell, median of {rounds} rounds):")
        print(f"  {'sessions':>8}  " + "  ".join(f"{name:>12}" for name in layouts) + "   2 hosts / this host")
        for sessions in concurrency:
            medians = [statistics.median(rates[(name, sessions)]) for name in layouts]
            print(f"  {sessions:>8}  " + "  ".join(f"{m:>12.0f}" for m in medians) + f"   {medians[2] / medians[0]:>6.2f}x")
    finally:
        for service in services.values():
            await service.shutdown()
        placement.clear_host_groups()
        for job in jobs.values():
            job.kill()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=4000, help="steps per cell")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (the median is printed)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.total_steps, args.rounds, args.concurrency))
