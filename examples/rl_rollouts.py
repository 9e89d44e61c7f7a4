#!/usr/bin/env python3
"""64 concurrent RL-style rollouts from one asyncio event loop.

Each rollout gets its own sandbox and a persistent shell session, then runs a
multi-step episode: the "policy" writes an action file, the "environment"
command reads it and answers with an observation and a reward, and the
rollout reads results back through the files API. At the end it prints the
steps per second across all rollouts.

    pip install ./sdk/python        # the SDK, as installed (once)
    export WARREN_URL=http://127.0.0.1:7070
    export WARREN_TOKEN=$(cat /var/lib/warren/admin-token)
    python3 examples/rl_rollouts.py --rollouts 64 --steps 8 --image busybox
"""

import argparse
import asyncio
import random
import sys
import time

import warren

ENV_SCRIPT = """#!/bin/sh
# A toy environment: reward is 1 when the action matches the hidden target.
action=$(cat /episode/action)
target=$(cat /episode/target)
if [ "$action" = "$target" ]; then r=1; else r=0; fi
echo "$r" >> /episode/rewards
echo "obs step=$STEP action=$action reward=$r"
"""


async def rollout(client: warren.AsyncClient, idx: int, steps: int, image: str) -> dict:
    rng = random.Random(idx)
    async with client.create(image=image, cpu=0.25, memory_mb=64, ttl=600,
                             labels={"example": "rl-rollouts", "rollout": str(idx)}) as sb:
        env = sb.session("env")
        await sb.files.mkdir("/episode")
        await sb.files.write("/episode/env.sh", ENV_SCRIPT, mode=0o755)
        await sb.files.write("/episode/target", "%d\n" % rng.randrange(4))
        await env.run("cd /episode && : > rewards")
        for step in range(steps):
            await sb.files.write("/episode/action", "%d\n" % rng.randrange(4))
            r = await env.run("STEP=%d ./env.sh" % step, timeout=30)
            if not r.ok:
                raise RuntimeError("rollout %d step %d: %s" % (idx, step, r.stderr))
        rewards = (await sb.files.read("/episode/rewards")).split()
        return {"rollout": idx, "steps": steps, "return": sum(int(x) for x in rewards)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--image", default="busybox")
    args = ap.parse_args()

    async with warren.AsyncClient() as client:
        t0 = time.monotonic()
        results = await asyncio.gather(*(rollout(client, i, args.steps, args.image)
                                         for i in range(args.rollouts)), return_exceptions=True)
        elapsed = time.monotonic() - t0
    ok = [r for r in results if isinstance(r, dict)]
    failed = [r for r in results if not isinstance(r, dict)]
    steps = sum(r["steps"] for r in ok)
    mean_ret = sum(r["return"] for r in ok) / max(1, len(ok))
    print("%d rollouts ok, %d failed, %d steps in %.2fs: %.1f steps/s, mean return %.2f" % (
        len(ok), len(failed), steps, elapsed, steps / elapsed if elapsed else 0.0, mean_ret))
    for e in failed[:5]:
        print("  error:", repr(e))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
