"""Progress of the long waits (verl_pipe/assets/progress.py; issue 61(c)): the formatter and the throttle are pure, the
reporter writes a live line on a terminal and a line every 30 s in a log; the warm-start follows verl's SFT step lines
(verl_pipe/assets/warm_start.py sft_step)."""

import io

import pytest

from verl_pipe.assets.progress import LOG_EVERY_S, Progress, Throttle, duration, eta_s, progress_text, waiting
from verl_pipe.assets.warm_start import sft_step


@pytest.mark.parametrize("s, text", [(0, "0s"), (42.4, "42s"), (59.6, "1m00s"), (365, "6m05s"), (3720, "1h02m"),
                                     (-3, "0s")])
def test_duration(s, text):
    assert duration(s) == text


def test_eta_at_the_rate_so_far():
    assert eta_s(120, 720, 65.0) == pytest.approx(325.0)  # 65 s for 120 steps: 600 left at that rate
    assert eta_s(0, 720, 10.0) is None and eta_s(5, None, 10.0) is None and eta_s(5, 0, 10.0) is None
    assert eta_s(720, 720, 400.0) == 0.0 and eta_s(800, 720, 400.0) == 0.0


def test_progress_text_says_done_of_total_elapsed_and_eta():
    assert progress_text("warm-start SFT", 120, 720, 65.0) == \
        "warm-start SFT: 120/720 steps (17%), 1m05s elapsed, ETA 5m25s"
    assert progress_text("warm-start SFT", 0, 720, 3.0) == "warm-start SFT: 0/720 steps (0%), 3s elapsed, ETA ?"
    assert progress_text("x", 7, None, 3.0, unit="parts") == "x: 7 parts, 3s elapsed, ETA ?"
    assert progress_text("vLLM replicas starting", None, None, 90.0) == "vLLM replicas starting: 1m30s elapsed"


def test_the_eta_leaves_out_the_wait_before_the_first_step():
    """verl's SFT subprocess takes its start-up (imports, model load) before step 1: the ETA follows the steps' rate
    from the first count on, not the elapsed time over the steps done."""
    out, clock = io.StringIO(), Clock()
    p = Progress("warm-start SFT", total=100, out=out, tty=False, clock=clock, log_every_s=10.0)
    clock.t += 40.0  # start-up
    p.update(1)  # the first count (its line: the throttle's first interval has passed)
    assert out.getvalue() == "warm-start SFT: 1/100 steps (1%), 40s elapsed, ETA ?\n"
    clock.t += 10.0
    p.update(21)  # 20 steps in 10 s: 79 left, 40 s at that rate
    assert out.getvalue().splitlines()[-1] == "warm-start SFT: 21/100 steps (21%), 50s elapsed, ETA 40s"


def test_the_throttle_says_yes_once_per_interval():
    t = Throttle(30.0)
    assert [t.due(now) for now in (0.0, 1.0, 29.9, 30.0, 31.0, 59.9, 60.5)] == \
        [True, False, False, True, False, False, True]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_in_a_log_a_line_every_30_s_not_a_line_per_step():
    out, clock = io.StringIO(), Clock()
    p = Progress("warm-start SFT", total=720, out=out, tty=False, clock=clock)
    p.start()
    for step in range(1, 721):  # a step every 0.5 s: 360 s in all
        clock.t += 0.5
        p.update(step)
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "warm-start SFT: 720 steps"
    assert lines[-1] == "warm-start SFT: done in 6m00s"
    body = lines[1:-1]
    assert len(body) == int(360 // LOG_EVERY_S) == 12  # one line per 30 s
    assert body[0] == "warm-start SFT: 60/720 steps (8%), 30s elapsed, ETA 5m30s"
    assert "\r" not in out.getvalue()


def test_on_a_terminal_one_live_line_rewritten_in_place():
    out, clock = io.StringIO(), Clock()
    p = Progress("warm-start SFT", total=10, out=out, tty=True, clock=clock)
    for step in range(1, 11):
        clock.t += 1.0
        p.update(step)
    p.finish()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("warm-start SFT: done in 10s\n")  # one line in the end
    assert text.count("\r") == 11  # each update rewrote it (1 s apart: above the 0.5 s throttle), then the last
    assert "\r\x1b[2Kwarm-start SFT: 5/10 steps (50%), 5s elapsed, ETA 5s" in text


def test_a_wait_says_what_it_waits_for_and_how_it_ended():
    out = io.StringIO()
    with waiting("trainer workers init", out=out, tty=False, log_every_s=0.01):
        import time

        time.sleep(0.1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "trainer workers init ..." and lines[-1].startswith("trainer workers init: done in ")
    assert any(line.endswith(" elapsed") for line in lines[1:-1])  # the beat while it waited
    out = io.StringIO()
    with pytest.raises(RuntimeError), waiting("starting Ray", out=out, tty=False):
        raise RuntimeError("boom")
    assert out.getvalue().splitlines()[-1].startswith("starting Ray: stopped after ")


def test_the_warm_start_follows_verls_sft_step_lines():
    """verl's console logger (concat_dict_to_str): ``step:N - key:value - ...``; anything else is not a step."""
    assert sft_step("step:120 - train/loss:0.53 - train/lr:0.003\n") == 120
    assert sft_step("step:7\n") == 7
    # after the unfinished line of verl's tqdm bar, as the captured output has it
    assert sft_step("Epoch 1/1000:   6%|▋         | 1/16 [00:02<00:36,  2.45s/it]step:2 - perf/max_memory_allocated_gb:0.0"
                    " - train/loss:6.9\n") == 2
    for line in ("Epoch 1/1000:  12%|#2   | 3/25", "stepping: 3", "global_step:3 - x:1", "train/step:3 - x",
                 "Total time for train steps: 3s", "step:3x"):
        assert sft_step(line) is None, line
