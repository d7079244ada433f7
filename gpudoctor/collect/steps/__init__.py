"""Finding the training steps of an unmodified script, and timing every one of them.

The markers, most specific first
--------------------------------
A step is one iteration of the script's loop. What marks it is chosen per run from
what the script actually does, most specific first:

1. ``optimizer``: an optimizer's ``step()`` returns (a wrapper around the ``step`` of
   each optimizer class the script instantiates; the first optimizer that steps marks
   the steps, and a step inside another optimizer's step, a wrapper's inner optimizer,
   marks nothing). Gradient accumulation is several micro-batches (``backward()``
   calls) in one step; several optimizers that each step once in an iteration (a
   GAN's discriminator and generator) make one step, whose ``backward()`` calls are
   theirs, not micro-batches (``StepTracker.other_steps``).
2. ``backward``: ``torch.autograd.backward`` / ``Tensor.backward()`` returns, when
   no optimizer steps (parameters updated by hand).
3. ``module``: a call of the root module returns (the outermost ``nn.Module`` with
   parameters, not its submodules), when nothing calls ``backward()`` (evaluation,
   inference).
4. ``dataloader``: the loop asks a ``DataLoader`` for its next batch (a step runs
   from one ``__next__`` call to the next).

When none of these happens, nothing is a step: ``timewindow`` records seconds 5–10 of
the script instead (``step_source: "time"``).

How a marker is established, and gives way
------------------------------------------
A run cannot know at its start whether an optimizer will ever step, so the first
step (step 0) is provisional: it opens at the first sign of a loop (an optimizer
created, a batch asked for, the root module called, ``backward()`` called) and no
instrument runs in it. Then:

- ``optimizer`` is established at its first step: step 0 ends there (nothing is
  more specific).
- ``backward`` and ``module`` are established at their second occurrence with
  nothing more specific in between (a more specific kind seen once becomes the
  candidate instead: a training loop calls the model, then ``backward()``, then
  ``optimizer.step()`` in its first iteration). Step 0 is then split where the
  candidate first occurred, so step 0 is the first iteration and step 1 the
  second: the step count is the iteration count. While an optimizer object exists
  but has not stepped, they wait up to ``DEFER_WHILE_OPTIMIZER_IDLE`` occurrences
  for it (gradient accumulation takes several backward calls before the first
  optimizer step); step 0 then holds them all.
- ``dataloader`` is established at the second batch asked for with no other
  candidate (its steps start where a batch is asked for, so step 0 is one
  iteration).

A more specific marker that appears later (training after an evaluation pass)
takes over: ``optimizer`` at once, ``backward`` / ``module`` at their second
occurrence. The step in progress ends at the new marker's event (a step that
straddles the change), each row of ``steps.jsonl`` says which marker ended it, and
the instruments start over: the torch.profiler window in progress is exported,
the schedule counts ``skip_first`` again from the new marker's first step, and the
cProfile window is scheduled afresh, so the steps that define the run are profiled.

Phases
------
The same hooks time each step's phases on the host, exclusive of each other: time
blocked in ``DataLoader.__next__`` (data wait), in the root module's calls
(forward), in ``backward()`` and in ``optimizer.step()``; the rest of the step is the
loop's own work ("other"). They count only on the loop's thread. Exclusive without a
stack: ``acc[PHASE]`` says which phase is in progress (0: none). A phase that starts
while none is (the usual case, the hooks' inline path) adds its whole time to its own
figure; one that starts inside another (a ``backward()`` inside LBFGS's
``step(closure)``, a batch asked for inside the forward: the hooks' slower path,
:meth:`StepTracker.phase_start` / :meth:`StepTracker.phase_end`) also takes its time
off the enclosing phase's figure, so each phase keeps only its own. The closure of
``optimizer.step(closure)`` (Lightning, LBFGS) is the model's work: its whole time is taken off the
optimizer's figure and no phase is in progress inside it (``patches.closure_marker``), so its forward and
backward are timed as in a loop that calls them outside ``step()``. No GPU
synchronization is added: on CUDA the GPU time of each step comes from one CUDA
event per boundary (``CudaStepTimer``), read back when complete; the events come from a
small pool (an event read is recorded again), not one new ``torch.cuda.Event`` per step.

Cost
----
In a training loop every Python operation of a hook costs ~0.04 µs (the loop's work
has left gpudoctor's code and data out of the caches), so the hot path is counted in
operations and in objects touched. Everything the hooks read or write on their usual
path lives in one list, ``acc`` (the step's figures, its start, index and end, the
phase in progress, the fast-path horizon, the threads each hook compares with, the
marking optimizer's id, the root module's calls): no attribute of the tracker is read.
A boundary with no instrument due (the ``_plan_fast`` horizon: the next profiler
window, the cProfile window, ``--steps``, CUDA; a ``getrusage`` read every
``RUSAGE_EVERY_NS``, the lines encoded and written once a second) is
:meth:`StepTracker.fast_close`: ``acc`` is copied onto a list of ints and the next
step opened, with no object made and no method called; the optimizer's and
``backward()``'s hooks do it inline. The hooks handle the common case inline
(``backward()`` and the root module's calls only add their time when another marker
ends the steps; no other phase in progress), each recognising it by one comparison of
the thread with the one ``acc`` keeps for it (``OPT_THREAD``, ``TRAIN_THREAD``,
``BATCH_THREAD``, ``BWD_THREAD``: ``NO_THREAD`` while tracking is off or another marker
ends the steps).
Module hooks sit on the root module instance only (a global module hook would push
every submodule call off ``nn.Module``'s fast path; ``markers.RootModuleWatch``).
``benchmarks/overhead.py --hooks-only`` measures the whole cost per step of each
loop shape. ``optimizer.step()``'s bookkeeping runs once it has returned (a wrapper
around the class's ``step``), so that nothing gpudoctor does lands inside the
``Optimizer.step#…`` range of the trace, and ``--steps N`` stops the script from a
plain call site.

Step ``k`` runs from the end of gpudoctor's bookkeeping after step ``k-1`` to the
return of its marked call (to the next ``__next__`` call with ``dataloader``). In
``dataloader`` mode the time between the end of an epoch (``StopIteration``) and
the next epoch's first batch belongs to no step.

The package, by concern
-----------------------
``tracker`` (``StepTracker``: the boundaries, the marker cascade, the phases; the hooks' hot
path, kept in one class), ``fields`` (the indices of ``acc`` and the markers' ranks), ``rows``
(what a boundary keeps of a step, and the lines of ``steps.jsonl``), ``cuda`` (``CudaStepTimer``),
``cprofile_window`` (``CprofileWindow``), ``limit`` (``--steps N``). What is imported from
``gpudoctor.collect.steps`` is re-exported here: the hooks bind these names once, when they are
installed, so the split adds no lookup to a step.
"""

from __future__ import annotations

from gpudoctor.collect.steps.cprofile_window import CprofileWindow
from gpudoctor.collect.steps.cuda import CudaStepTimer
from gpudoctor.collect.steps.fields import (
    BACKWARD,
    BATCH_THREAD,
    BWD_THREAD,
    DEFER_WHILE_OPTIMIZER_IDLE,
    DUE,
    END,
    EPOCH,
    FAST_LAST,
    FORWARD,
    IN_BACKWARD,
    IN_FORWARD,
    IN_OPTIMIZER,
    IN_WAIT,
    INDEX,
    MARKER,
    MARKER_CALLS,
    N_BATCHES,
    N_BWD,
    N_FIGURES,
    NO_THREAD,
    OPT_THREAD,
    OPTIMIZER,
    PHASE,
    RANK,
    ROOT_CALLS,
    ROW,
    RUSAGE_EVERY_NS,
    START,
    TRAIN_THREAD,
    WAIT,
)
from gpudoctor.collect.steps.limit import StopAfterSteps
from gpudoctor.collect.steps.tracker import StepTracker

__all__ = [
    "BACKWARD", "BATCH_THREAD", "BWD_THREAD", "DEFER_WHILE_OPTIMIZER_IDLE", "DUE", "END", "EPOCH", "FAST_LAST",
    "FORWARD", "IN_BACKWARD", "IN_FORWARD", "IN_OPTIMIZER", "IN_WAIT", "INDEX", "MARKER", "MARKER_CALLS",
    "N_BATCHES", "N_BWD", "N_FIGURES", "NO_THREAD", "OPT_THREAD", "OPTIMIZER", "PHASE", "RANK", "ROOT_CALLS",
    "ROW", "RUSAGE_EVERY_NS", "START", "TRAIN_THREAD", "WAIT",
    "CprofileWindow", "CudaStepTimer", "StepTracker", "StopAfterSteps",
]
