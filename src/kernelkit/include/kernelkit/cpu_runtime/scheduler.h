// kernelkit/cpu_runtime/scheduler.h: the fibers of one threadgroup and their rendezvous
// (part of libkkrt).
//
// One fiber per existing thread, each on its own stack. The scheduler runs a pass: every
// runnable fiber runs, in thread order, until it blocks at a rendezvous or returns (a blocking
// fiber switches straight to the next one). When the pass ends every live fiber is blocked,
// and resolve() picks who runs next:
//   - in each SIMD-group, the lanes waiting at one SIMD site (the lowest line) complete that
//     call together: they are its active lanes, whatever the other lanes wait at;
//   - when no lane waits at a SIMD site, every live thread waits at a threadgroup barrier: one
//     site releases them all, several sites can never complete: an error naming the sites.
// Returned threads are not live: they count for no rendezvous.
#pragma once

#include <string.h>

#include "messages.h"

namespace {

[[noreturn]] void fail_here(const kk_thread_ctx* t, const char* message);

// Leaves the running fiber `self` (blocked or finished) for the next runnable
// fiber of this pass, or for the scheduler when the pass is over.
inline void yield_next(Worker* w, Fiber* self) {
  Ctx* to;
  const kk_thread_ctx* t;
  if (++w->run_pos < w->run_count) {
    Fiber* n = &w->fibers[w->runlist[w->run_pos]];
    to = &n->ctx;
    t = &n->t;
  } else {
    to = &w->sched;
    t = nullptr;
  }
  *w->current = t;
  ctx_switch(&self->ctx, to);
}

void fiber_main(void* p) {
  Fiber* f = static_cast<Fiber*>(p);
  Worker* w = f->w;
  bool threw = false;
  try {
    w->fn(w->args, &f->t);
  } catch (...) {
    threw = true;
  }
  if (threw) fail_here(&f->t, "a C++ exception escaped the kernel");
  f->state = kDone;
  w->live--;
  w->sg[f->t.tindex >> 5].live &= ~(1u << (f->t.tindex & 31u));
  w->dirty |= 1u << (f->t.tindex >> 5);
  yield_next(w, f);
  __builtin_trap();  // a finished fiber is never resumed
}

// Completes the rendezvous of `lanes` of SIMD-group S, all waiting at one site: they are the
// call's active lanes.
void complete_simd(Worker* w, SimdGroup& S, unsigned lanes, unsigned* cnt) {
  const Fiber& first = w->fibers[S.fiber[__builtin_ctz(lanes)]];
  size_t size = first.xsize;
  if (size) {
    if (w->gather.size() < 32 * size) w->gather.resize(32 * size);
    unsigned char* g = w->gather.data();
    for (unsigned m = lanes; m; m &= m - 1) {
      unsigned lane = unsigned(__builtin_ctz(m));
      const Fiber& f = w->fibers[S.fiber[lane]];
      memcpy(g + lane * size, f.xin, std::min(size, f.xsize));
    }
    unsigned lo = unsigned(__builtin_ctz(lanes)), hi = 31u - unsigned(__builtin_clz(lanes));
    for (unsigned m = lanes; m; m &= m - 1) {
      Fiber& f = w->fibers[S.fiber[__builtin_ctz(m)]];
      if (f.xout && f.xsize == size)
        memcpy(static_cast<unsigned char*>(f.xout) + lo * size, g + lo * size, (hi - lo + 1) * size);
    }
  }
  for (unsigned m = lanes; m; m &= m - 1) {
    unsigned i = unsigned(S.fiber[__builtin_ctz(m)]);
    w->fibers[i].xmask = lanes;
    w->fibers[i].state = kRunnable;
    w->runlist[(*cnt)++] = i;
  }
}

// The lanes of SIMD-group S waiting at the SIMD site to complete next: the one with the lowest
// source line. A GPU runs the two sides of a branch one after the other and meets again after
// it, so the lanes at a SIMD site inside an `if` go before the lanes already past it (a higher
// line) and wait there for them. 0: no lane waits at a SIMD site.
unsigned next_simd_site(Worker* w, const SimdGroup& S) {
  const Fiber* pick = nullptr;
  for (unsigned m = S.live; m; m &= m - 1) {
    const Fiber& f = w->fibers[S.fiber[__builtin_ctz(m)]];
    if (f.state == kAtSimd && (!pick || f.line < pick->line)) pick = &f;
  }
  unsigned lanes = 0;
  if (pick)
    for (unsigned m = S.live; m; m &= m - 1) {
      const unsigned lane = unsigned(__builtin_ctz(m));
      const Fiber& f = w->fibers[S.fiber[lane]];
      if (f.state == kAtSimd && same_site(*pick, f)) lanes |= 1u << lane;
    }
  return lanes;
}

// Called when every live fiber is blocked: fills the next run list, or records an error and
// returns false. The lanes of a SIMD-group that wait at a SIMD site are that call's active
// lanes, whatever the others wait at (Metal's and CUDA's active-lane semantics): one site of
// each SIMD-group completes per pass. Only when no SIMD site is left does a threadgroup
// barrier release its threads (every live thread must be waiting there).
// Only the SIMD-groups touched in the pass, or left with waiting lanes, can complete.
bool resolve(Worker* w) {
  unsigned cnt = 0, pending = 0;
  const unsigned dirty = w->dirty;
  w->dirty = 0;
  for (unsigned d = dirty; d; d &= d - 1) {
    const unsigned s = unsigned(__builtin_ctz(d));
    SimdGroup& S = w->sg[s];
    const unsigned lanes = next_simd_site(w, S);
    if (!lanes) continue;
    complete_simd(w, S, lanes, &cnt);
    for (unsigned m = S.live & ~lanes; m; m &= m - 1)
      if (w->fibers[S.fiber[__builtin_ctz(m)]].state == kAtSimd) pending |= 1u << s;
  }
  w->dirty = pending;
  if (cnt) {
    w->run_count = cnt;
    return true;
  }
  // Every live fiber waits at a threadgroup barrier.
  if (w->at_barrier != w->live) {
    char msg[256];
    snprintf(msg, sizeof msg, "kernel '%s': internal error in the fiber scheduler (%u of %u live "
             "threads at a barrier in %s)", kernel_name(w->d), w->at_barrier, w->live,
             group_text(w).c_str());
    set_error(w->launch, msg);
    return false;
  }
  w->at_barrier = 0;
  const Fiber* first = nullptr;
  for (unsigned i = 0; i < w->nfibers; ++i) {
    Fiber& f = w->fibers[i];
    if (f.state == kDone) continue;
    if (!first) first = &f;
    else if (!same_site(*first, f)) {
      barrier_error(w);
      return false;
    }
    w->runlist[cnt++] = i;
  }
  for (unsigned k = 0; k < cnt; ++k) w->fibers[w->runlist[k]].state = kRunnable;
  w->run_count = cnt;
  return cnt != 0;
}

[[noreturn]] void not_in_fiber(const kk_thread_ctx* t, const kk_site* site, const char* what) {
  char msg[512];
  const char* op = site && site->op ? site->op : what;
  if (site && site->file)
    snprintf(msg, sizeof msg, "%s at %s:%u needs the fiber runtime, but this kernel was compiled in "
             "loop mode (its use of barriers or SIMD-group functions was not detected)",
             op, site->file, site->line);
  else
    snprintf(msg, sizeof msg, "%s needs the fiber runtime, but this kernel was compiled in loop "
             "mode (its use of barriers or SIMD-group functions was not detected)", op);
  fail_here(t, msg);
}

inline Fiber* fiber_of(const kk_thread_ctx* t, const kk_site* site, const char* what) {
  if (__builtin_expect(t == nullptr || t->rt == nullptr, 0)) not_in_fiber(t, site, what);
  return static_cast<Fiber*>(t->rt);
}

// Blocks the running fiber at a rendezvous until the scheduler releases it.
inline void block(Fiber* f, unsigned char state, const kk_site* site, const char* what,
                  const void* ra) {
  if (site && site->file) {
    f->op = site->op ? site->op : what;
    f->file = site->file;
    f->line = site->line;
    f->ra = nullptr;
  } else {
    f->op = site && site->op ? site->op : what;
    f->file = nullptr;
    f->line = 0;
    f->ra = ra;
  }
  f->state = state;
  f->w->dirty |= 1u << (f->t.tindex >> 5);
  if (state == kAtBarrier) f->w->at_barrier++;
  yield_next(f->w, f);
}

}  // namespace
