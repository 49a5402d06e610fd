"""Who holds the GIL: a summary of ``py-spy record --gil --threads -f raw`` output.

    py-spy record --gil --threads --nonblocking -r 500 -f raw -o gil.txt -p <pid>
    python bench/gil_share.py gil.txt

With ``--gil`` py-spy samples only the thread holding the GIL, so each thread's share of the
samples is its share of the time the GIL was held. Prints each thread's share and, for the
busiest threads, the frames where they held it. Samples taken while a module was being imported
(the server's start-up) are left out unless ``--with-imports``.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

IMPORTING = "(<frozen importlib._bootstrap"  # a frame of the import machinery


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="py-spy's raw (collapsed stacks) output")
    parser.add_argument("--threads", type=int, default=4, help="threads to show frames of")
    parser.add_argument("--frames", type=int, default=5, help="frames shown per thread")
    parser.add_argument("--with-imports", action="store_true", help="keep start-up's imports")
    args = parser.parse_args()
    per_thread: Counter[str] = Counter()
    frames: defaultdict[str, Counter[str]] = defaultdict(Counter)
    with open(args.raw) as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            thread, *calls = stack.split(";")
            if not args.with_imports and any(IMPORTING in call for call in calls):
                continue
            per_thread[thread] += int(count)
            leaf = " <- ".join(call.split(" (")[0] for call in reversed(calls[-3:]))
            frames[thread][leaf] += int(count)
    total = sum(per_thread.values()) or 1
    print(f"{total} samples with the GIL held")
    for thread, count in per_thread.most_common():
        print(f"{100 * count / total:6.1f}%  {thread}")
    for thread, _ in per_thread.most_common(args.threads):
        print(f"\n{thread}")
        for leaf, count in frames[thread].most_common(args.frames):
            print(f"  {100 * count / total:6.1f}%  {leaf[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
