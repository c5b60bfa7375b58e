"""Stands in for `python -m smollab lanes grpo ...` in lab tests (stdlib only, starts at once).

Two modes, as the real worker: `grpo --inbox DIR --max-lanes N [--threads T]` takes trials posted
to DIR (smollab.rundir.inbox's files) as lanes, up to N at once, and exits after `close` once
its lanes have ended; `grpo [BASE] [key=value ...] --lane "key=value ..." ... [--threads T]` runs
one lane per --lane and exits (0, or 1 if a lane failed, 130 if interrupted).

All lanes step together: an iteration sleeps FAKE_STEP_S x (1 + FAKE_LANE_COST x (lanes - 1)).
Per lane, optim.lr picks the behaviour as in the fake child: >= 100 fails at once, >= 10 diverges
(NaN at step 3), else the loss falls as 5 * exp(-lr * step). A lane checkpoints every
train.save_interval steps (default 5) as checkpoints/step_<N>/trainer_state.pt, as the fake child
does, resumes from the newest, and ends on its `.stop` (status interrupted, exit 130) unless
FAKE_IGNORE_STOP is set. FAKE_DIE_AT=n: the worker dies (exit 3) when a lane reaches step n (with FAKE_DIE_ONCE=path,
only while that file does not exist; dying creates it; with FAKE_DIE_IN=text, only a worker whose
--inbox path ends with that text; with FAKE_DIE_AFTER=path, only once that path exists).
FAKE_UNTIL_DONE=n: a lane with train.max_steps >= 1000 completes once n sibling run dirs have.
The worker prints `lanes: a b c` whenever its set of lanes changes.
"""

import csv
import json
import math
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

COLS = ["step", "wall_s", "lr", "loss", "reward_mean", "step_s", "peak_mem_mb"]
INBOX = None  # the worker's --inbox path (FAKE_DIE_IN)
FINISHED = ("completed", "diverged", "degenerate", "stuck", "pruned")


def write_atomic(path, text):
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Lane:
    def __init__(self, name, argv):
        args = dict(a.split("=", 1) for a in argv if "=" in a)
        self.name, self.argv = name, argv
        self.run = Path(args["run.dir"])
        self.run.mkdir(parents=True, exist_ok=True)
        self.lr = float(args.get("optim.lr", "1e-3"))
        self.max_steps = int(args.get("train.max_steps", "10"))
        self.max_time = float(args.get("train.max_time", "inf"))
        self.save_every = int(args.get("train.save_interval", "5")) or 5
        self.summary_path, self.ckpts = self.run / "summary.json", self.run / "checkpoints"
        self.summary = (
            json.loads(self.summary_path.read_text()) if self.summary_path.exists() else {}
        )
        self.code = None
        if args.get("run.resume") == "never":
            self.summary = {}
            for f in (self.summary_path, self.run / "metrics.csv"):
                f.unlink(missing_ok=True)
            shutil.rmtree(self.ckpts, ignore_errors=True)
        if self.summary.get("status") in FINISHED:
            self.code = 0
            return
        saved = [
            json.loads((p / "trainer_state.pt").read_text())["step"]
            for p in self.ckpts.glob("step_*")
            if (p / "trainer_state.pt").exists()
        ]
        self.step = max(saved, default=0)
        rows = []
        if self.step and (self.run / "metrics.csv").exists():
            rows = [
                r
                for r in csv.DictReader(open(self.run / "metrics.csv"))
                if int(r["step"]) <= self.step
            ]
        with open(self.run / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLS)
            w.writeheader()
            w.writerows(rows)
        self.t0 = time.time()
        self.write_summary(status="running", command="grpo", argv=argv)
        if self.lr >= 100:
            self.end("failed", f"RuntimeError: boom at lr {self.lr}", 1)

    def write_summary(self, **kw):
        self.summary.update(kw)
        write_atomic(self.summary_path, json.dumps(self.summary))

    def end(self, status, evidence, code):
        self.write_summary(status=status, evidence=evidence, steps=getattr(self, "step", 0))
        self.code = code

    def advance(self, dt):
        self.step += 1
        loss = (
            float("nan") if self.lr >= 10 and self.step >= 3 else 5 * math.exp(-self.lr * self.step)
        )
        mem = float(os.environ.get("FAKE_MEM_MB", "0")) or 50.0
        with open(self.run / "metrics.csv", "a", newline="") as f:
            csv.DictWriter(f, fieldnames=COLS).writerow(
                {
                    "step": self.step,
                    "wall_s": time.time() - self.t0,
                    "lr": self.lr,
                    "loss": loss,
                    "reward_mean": -loss,
                    "step_s": dt,
                    "peak_mem_mb": mem,
                }
            )
        once = os.environ.get("FAKE_DIE_ONCE")  # a file: die only while it does not exist
        if (
            os.environ.get("FAKE_DIE_AT")
            and self.step >= int(os.environ["FAKE_DIE_AT"])
            and not (once and os.path.exists(once))
            and str(INBOX).endswith(os.environ.get("FAKE_DIE_IN", ""))
            and os.path.exists(os.environ.get("FAKE_DIE_AFTER", os.curdir))
        ):
            if once:
                Path(once).write_text("died")
            print(f"smollab: error: fake worker died at step {self.step}", flush=True)
            os._exit(3)
        if not math.isfinite(loss):
            self.end("diverged", f"loss is nan at step {self.step}", 0)
        elif self.step % self.save_every == 0:
            tmp = self.ckpts / ".c.tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "trainer_state.pt").write_text(json.dumps({"step": self.step}))
            os.replace(tmp, self.ckpts / f"step_{self.step}")
        long_enough = self.step >= self.max_steps or time.time() - self.t0 > self.max_time
        until = os.environ.get("FAKE_UNTIL_DONE")
        if until and self.max_steps >= 1000:  # a long lane: until that many siblings completed
            done = [
                p
                for p in self.run.parent.glob("*/summary.json")
                if json.loads(p.read_text()).get("status") == "completed"
            ]
            long_enough = long_enough or len(done) >= int(until)
        if self.code is None and long_enough:
            self.end("completed", None, 0)


def main():
    global INBOX
    argv = sys.argv[1:]
    assert argv[0] == "grpo", argv
    rest, inbox, max_lanes, lane_args, shared = argv[1:], None, 10**6, [], []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("--inbox", "--max-lanes", "--threads", "--lane"):
            v = rest[i + 1]
            i += 2
            if a == "--inbox":
                inbox = INBOX = Path(v)
            elif a == "--max-lanes":
                max_lanes = int(v)
            elif a == "--lane":
                lane_args.append(shlex.split(v))
            continue
        shared.append(a)
        i += 1
    stop_all = []
    signal.signal(signal.SIGINT, lambda *a: stop_all.append(1))
    lanes, seen, failed = [], set(), False
    if inbox is None:
        lanes = [Lane(f"l{j}", ["grpo", *shared, *la]) for j, la in enumerate(lane_args)]
    shown = None
    while True:
        if inbox is not None:
            posted = sorted(inbox.glob("*.trial.json"), key=lambda p: p.stat().st_mtime_ns)
            for p in posted:
                name = p.name[: -len(".trial.json")]
                if name in seen or len(lanes) >= max_lanes:
                    continue
                seen.add(name)
                lanes.append(Lane(name, json.loads(p.read_text())["argv"]))
            for lane in lanes:
                if (
                    lane.code is None
                    and (inbox / f"{lane.name}.stop").exists()
                    and not os.environ.get("FAKE_IGNORE_STOP")
                ):
                    lane.end("interrupted", f"interrupted at step {lane.step}", 130)
        if stop_all:
            for lane in lanes:
                if lane.code is None:
                    lane.end("interrupted", f"interrupted at step {lane.step}", 130)
        active = [lane for lane in lanes if lane.code is None]
        names = " ".join(lane.name for lane in active)
        if names != shown:
            print(f"lanes: {names}", flush=True)
            shown = names
        if active:
            dt = float(os.environ.get("FAKE_STEP_S", "0.01")) * (
                1 + float(os.environ.get("FAKE_LANE_COST", "0")) * (len(active) - 1)
            )
            time.sleep(dt)
            for lane in active:
                lane.advance(dt)
        for lane in [lane for lane in lanes if lane.code is not None]:
            failed = failed or lane.code == 1
            if inbox is not None:
                write_atomic(inbox / f"{lane.name}.exit", str(lane.code))
                lanes.remove(lane)
        if inbox is None:
            if all(lane.code is not None for lane in lanes):
                codes = {lane.code for lane in lanes}
                sys.exit(130 if 130 in codes else 1 if 1 in codes else 0)
        elif not lanes and ((inbox / "close").exists() or stop_all):
            sys.exit(0)
        if not active:
            time.sleep(0.01)


main()
