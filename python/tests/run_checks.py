"""Checks of fptrun's own logic (fpt/run.py) with stand-in processes:
which process a failure is blamed on; how --bind-cores deals the cores.
Run by tests/python_test.go."""
import sys
import time

from fpt import run


class Stand:
    """A process whose poll() gives code once after seconds have passed."""

    def __init__(self, name, code, after):
        self.label = {"name": name}
        self.code, self.at = code, time.monotonic() + after

    def poll(self):
        return self.code if time.monotonic() >= self.at else None


def culprit():
    run.CULPRIT_GRACE = 0.5
    cases = [
        # (the processes still running, what the scheduler's failure is blamed on)
        ("a worker that fails after the scheduler", [Stand("worker1", 1, 0.1), Stand("worker0", None, 9)], "worker1"),
        ("a worker that ends cleanly", [Stand("worker1", 0, 0.1), Stand("worker0", None, 9)], "scheduler"),
        ("a worker that fails past the grace", [Stand("worker1", 1, 2.0)], "scheduler"),
        ("no worker running", [Stand("server0", 1, 0.0)], "scheduler"),
    ]
    failed = 0
    for name, procs, want in cases:
        running = [(p.label, p) for p in procs]
        sched = Stand("scheduler", 1, 0)
        label, p, code = run._culprit(sched.label, sched, 1, running)
        if label["name"] != want or code != 1:
            print("FAIL %s: blamed %s (status %s), want %s" % (name, label["name"], code, want))
            failed += 1
        elif want != "scheduler" and any(e[1] is p for e in running):
            print("FAIL %s: %s is still listed as running" % (name, want))
            failed += 1
    if failed:
        sys.exit(1)
    print("PASS: %d cases" % len(cases))


def cores():
    cases = [
        # (the launcher's cores, workers, each worker's slice, their cpu lists)
        ({0, 1}, 2, [[0], [1]], ["0", "1"]),
        ({0, 1}, 1, [[0, 1]], ["0-1"]),
        ({0, 1}, 4, [[0], [1], [0], [1]], ["0", "1", "0", "1"]),
        (set(range(16)), 3, [list(range(0, 6)), list(range(6, 11)), list(range(11, 16))], ["0-5", "6-10", "11-15"]),
        ({8, 2, 3, 5}, 2, [[2, 3], [5, 8]], ["2-3", "5,8"]),
        ({7}, 2, [[7], [7]], ["7", "7"]),
    ]
    failed = 0
    for have, n, want, lists in cases:
        got = run.core_slices(have, n)
        shown = [run.cpu_list(c) for c in got]
        if got != want or shown != lists:
            print("FAIL core_slices(%s, %d) = %s (%s), want %s (%s)" % (sorted(have), n, got, shown, want, lists))
            failed += 1
    if failed:
        sys.exit(1)
    print("PASS: %d cases" % len(cases))


if __name__ == "__main__":
    {"culprit": culprit, "cores": cores}[sys.argv[1]]()
