"""The figures of the step in progress as the hooks keep them (``StepTracker.acc``), and the markers.

Everything the hooks of ``patches`` and ``markers`` read or write on their usual path lives in one
list, ``acc``; its indices are here, imported once by the tracker and bound by each hook when it is
installed (a module-level int costs the hooks nothing more than a local). Also the markers' ranks
(a more specific one takes over) and how a report names them.
"""

from __future__ import annotations

# How specific each marker is: a higher one takes over from a lower one.
RANK = {"none": 0, "dataloader": 1, "module": 2, "backward": 3, "optimizer": 4}
# While an optimizer object exists but has not stepped yet, backward / module / dataloader wait
# this many occurrences for it before they mark steps: gradient accumulation calls backward()
# several times before the first optimizer step (step 0 then holds those micro-batches).
DEFER_WHILE_OPTIMIZER_IDLE = 64
# how a report names each marker
MARKER_CALLS = {
    "optimizer": "optimizer.step()",
    "backward": "loss.backward()",
    "module": "the root module's forward",
    "dataloader": "DataLoader batches",
    "time": "a time-based window (no step structure)",
    "none": "nothing",
}
# indices of StepTracker.acc, the figures of the step in progress: the phases' times (ns, exclusive
# of each other), backward() calls, DataLoader batches received (the first N_FIGURES, zeroed as a step
# opens), then the step's start, the end a fast boundary fills in before it copies the whole list as
# the step's row (StepTracker.fast_close), the epoch (-1: none known), and the phase in progress on
# the loop's thread (its index + 1; 0: none; see "Phases" in the package's docstring); then what a fast boundary reads: the
# step's index, the first index whose end is not fast (``_plan_fast``) and the time from which a fast
# boundary has a getrusage read or lines due (``_set_due``); then what the hooks compare with (see "Cost"
# in the package's docstring): the loop's thread for each hook's usual case (NO_THREAD when there is none), the id() of
# the optimizer that marks the steps, and the calls of the root module
WAIT, FORWARD, BACKWARD, OPTIMIZER, N_BWD, N_BATCHES, START, END, EPOCH, PHASE, INDEX, FAST_LAST, DUE = range(13)
OPT_THREAD, TRAIN_THREAD, BATCH_THREAD, BWD_THREAD, MARKER, ROOT_CALLS = range(13, 19)
NO_THREAD = -1  # (threading.get_ident() is never negative)
IN_WAIT, IN_FORWARD, IN_BACKWARD, IN_OPTIMIZER = WAIT + 1, FORWARD + 1, BACKWARD + 1, OPTIMIZER + 1  # acc[PHASE]
N_FIGURES = 6
ROW = 19  # ints per step in a fast block (all of acc: one copy of pointers, no slice made)
_ZERO = (0,) * N_FIGURES
_NO_CPU = (None,) * 5  # a fast row's CPU figures when the next getrusage read covers its step

_Snapshot = tuple  # (t_ns, rusage, the step's acc as a tuple, epoch)

# the CPU figures of a step come from getrusage, a system call: 3-5 µs on a busy loop here, and the
# steps after it run slower (read every 2 ms, it cost a loop of 270 µs steps 3.5 µs per step in the
# median, measured in-process against no read; every 20 ms, nothing measurable). A boundary reads it
# when this long has passed since the last read, and that row's figures cover every step since
# (``cpu_steps``); the rows in between carry none
RUSAGE_EVERY_NS = 20_000_000
