#!/usr/bin/env python3
"""A minimal warren session: create a sandbox, run commands, move files, stop.

    pip install ./sdk/python        # the SDK, as installed (once)
    export WARREN_URL=http://127.0.0.1:7070
    export WARREN_TOKEN=$(cat /var/lib/warren/admin-token)
    python3 examples/quickstart.py [image]
"""

import sys

import warren


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else "busybox"
    client = warren.Client()
    with client.create(image=image, cpu=1, memory_mb=256, ttl=600,
                       labels={"example": "quickstart"}) as sb:
        print("sandbox", sb.id, "on", sb.node)

        r = sb.run("echo hello from $(hostname); uname -sr")
        print("exit", r.exit_code, "in %.1f ms" % r.duration_ms)
        print(r.stdout, end="")

        sb.files.write("/tmp/job.sh", "#!/bin/sh\nfor i in 1 2 3; do echo step $i; sleep 0.2; done\n",
                       mode=0o755)
        sb.run("/tmp/job.sh", on_stdout=lambda s: print("  live:", s, end=""))

        shell = sb.session("work")
        shell.run("mkdir -p /work && cd /work && echo 42 > answer.txt")
        print("cwd kept by the session:", shell.run("pwd").stdout.strip())
        print("answer:", sb.files.read("/work/answer.txt").decode().strip())
        print("files:", [f.name for f in sb.files.list("/work")])

        try:
            sb.run("exit 3", check=True)
        except warren.CommandFailed as e:
            print("failed as expected:", e.result.exit_code)
    print("stopped:", sb.state)


if __name__ == "__main__":
    main()
