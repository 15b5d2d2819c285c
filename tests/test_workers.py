"""`moai.workers`: spawned workers never see a Ctrl-C, and one that reaches the parent while they
start is handled just after, whatever other threads the parent runs."""

import subprocess
import textwrap

from conftest import PYTHON

HELD = textwrap.dedent(
    """
    import os, signal, threading, time
    from moai.workers import interrupts_left_to_parent

    running = True
    def other():  # a thread that does not block SIGINT: the kernel may hand the signal to it
        while running:
            time.sleep(0.001)
    threading.Thread(target=other, daemon=True).start()
    arrived = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    handled = 0
    for _ in range(20):
        arrived.clear()
        with interrupts_left_to_parent():
            os.kill(os.getpid(), signal.SIGINT)  # to the process, as Ctrl-C sends it
            time.sleep(0.01)
            inside = len(arrived)
        time.sleep(0.01)
        handled += inside == 0 and arrived == [signal.SIGINT]  # once, after the block
    running = False
    print(handled)
    """
)

NEVER_SEES = textwrap.dedent(
    """
    import os, signal, time
    from multiprocessing import get_context
    from moai.workers import interrupts_left_to_parent, spawn_pool

    def mask(pid):
        lines = open(f"/proc/{pid}/status").read().splitlines()
        return {k: int(v, 16) for k, v in (l.split(":") for l in lines if l.startswith(("SigBlk", "SigIgn")))}

    def never_sees(pid):
        return bool((mask(pid)["SigBlk"] | mask(pid)["SigIgn"]) & (1 << (signal.SIGINT - 1)))

    if __name__ == "__main__":
        # the first spawn of this process, as the tokenizer's reference process is (multiprocessing
        # starts its resource tracker then)
        alone = get_context("spawn").Process(target=time.sleep, args=(1.5,))
        with interrupts_left_to_parent():
            alone.start()
        with spawn_pool(2) as pool:
            workers = [alone.pid, *pool._processes]
            assert all(never_sees(pid) for pid in workers), [mask(p) for p in workers]
            for pid in workers:
                os.kill(pid, signal.SIGINT)
            time.sleep(0.5)
            assert pool.submit(sum, [1, 2]).result(timeout=30) == 3
        alone.join()
        assert alone.exitcode == 0, alone.exitcode
        assert not never_sees(os.getpid())  # the parent's mask and handler are as they were
        print("ok")
    """
)


def test_an_interrupt_while_workers_start_is_held_until_they_have_started():
    done = subprocess.run([PYTHON, "-c", HELD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["20"], done.stdout


def test_spawned_workers_never_see_sigint(tmp_path):
    script = tmp_path / "never_sees.py"  # a file: spawn imports the main module again
    script.write_text(NEVER_SEES)
    done = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr
    assert "KeyboardInterrupt" not in done.stderr, done.stderr
