// kernelkit/cpu_runtime/faults.h: a fault inside a kernel becomes its launch's error (part of
// libkkrt).
//
// Handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP and SIGABRT are installed once
// (SA_SIGINFO | SA_ONSTACK; the previous ones are kept) and every participant thread has an
// alternate signal stack, so that a thread that overflows its stack into the guard page is
// caught too. While a participant runs groups (Worker::in_kernel, set after the sigsetjmp in
// participate()), a fault records its signal, code and address and siglongjmps back to the
// participant, which unblocks the signal, turns the fault into the launch's error (naming the
// running fiber's thread; in loop mode pool.h finds the thread by running the group again) and
// stops; in fiber mode the group's fibers are abandoned as for kk_rt_fail. SIGABRT counts only
// when this process raised it (abort(), a failed assert()): one sent by another process is not
// the kernel's. Any other signal goes to the previous handler as it would have without us
// (Python's faulthandler, or the default action: death by the signal).
#pragma once

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>

#include "messages.h"

namespace {

constexpr int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT};
constexpr int kNumFaultSignals = int(sizeof kFaultSignals / sizeof kFaultSignals[0]);

std::atomic<int> g_in_launch{0};  // participants inside participate(), all threads
struct sigaction g_prev[kNumFaultSignals];
std::once_flag g_signals_once;

int signal_slot(int sig) {
  for (int i = 0; i < kNumFaultSignals; ++i)
    if (kFaultSignals[i] == sig) return i;
  return 0;
}

// Hands a signal that is not ours to the handler that was installed before ours, as it
// would have run without us.
void chain_signal(int sig, siginfo_t* si, void* uc) {
  const struct sigaction* p = &g_prev[signal_slot(sig)];
  const bool fault = si && si->si_code > 0;  // raised by the kernel, not by kill()/raise()
  if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
    p->sa_sigaction(sig, si, uc);
    return;
  }
  if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler == SIG_IGN) {
    if (!fault) return;  // a fault cannot be ignored: the kernel would kill the process
  } else if ((p->sa_flags & SA_SIGINFO) || p->sa_handler != SIG_DFL) {
    p->sa_handler(sig);
    return;
  }
  // The default action: restore it and raise again (delivered when this handler
  // returns; a fault would also recur on the faulting instruction).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

// Whether the signal is the running kernel's doing (not sent by someone else).
bool from_kernel(int sig, const siginfo_t* si) {
  if (!si) return false;
  if (sig == SIGABRT) return si->si_code == SI_TKILL && si->si_pid == getpid();  // abort()
  return si->si_code > 0;
}

void fault_handler(int sig, siginfo_t* si, void* uc) {
  if (g_in_launch.load(std::memory_order_relaxed) > 0 && from_kernel(sig, si)) {
    Worker* w = tls_worker;
    if (w && w->in_kernel) {
      w->in_kernel = 0;
      w->fault_addr = si->si_addr;
      w->fault_code = si->si_code;
      w->fault_sig = sig;
      siglongjmp(w->jb, 2);  // to participate(); the signal is unblocked there
    }
  }
  int saved = errno;
  chain_signal(sig, si, uc);
  errno = saved;
}

void install_signal_handlers() {
  std::call_once(g_signals_once, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < kNumFaultSignals; ++i) sigaction(kFaultSignals[i], &sa, &g_prev[i]);
  });
}

void unblock_signal(int sig) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // blocked while the handler ran
}

// A fault of a misaligned access: SIGBUS's BUS_ADRALN, or on Linux the SIGSEGV of a
// general-protection fault (SI_KERNEL), which x86 raises for an aligned vector instruction on a
// misaligned address (and for non-canonical addresses).
bool misaligned(int sig, int code) {
  if (sig == SIGBUS) return code == BUS_ADRALN;
#if defined(SI_KERNEL)
  return code == SI_KERNEL;
#else
  return false;
#endif
}

// What happened, and its usual cause: "<what> (SIGNAME)", "<cause>".
void describe_fault(const Worker* w, std::string* what, std::string* cause) {
  const int sig = w->fault_sig, code = w->fault_code;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(w->fault_addr);
  switch (sig) {
    case SIGSEGV:
    case SIGBUS: {
      const char* name = sig == SIGBUS ? "SIGBUS" : "SIGSEGV";
      if (w->in_guard_page(addr)) {
        const size_t kib = w->stacks.size() / 1024;
        append(*what, "stack overflow (invalid memory access at address 0x%llx in the guard page "
               "of the thread's %zu KiB stack, %s)", (unsigned long long)addr, kib, name);
        append(*cause, "deep recursion or large local arrays are the usual cause; "
               "KERNELKIT_CPU_STACK_SIZE sets the stack size (now %zuK)", kib);
      } else if (misaligned(sig, code)) {
        // x86's general-protection fault reports no address; an aligned vector access (movaps)
        // through a pointer off its alignment raises it, as a misaligned access does elsewhere
        append(*what, "invalid memory access (%s, %s)", name,
               sig == SIGBUS ? "a misaligned address" : "a general-protection fault: no address");
        *cause = "a vector load or store through a pointer not aligned to the vector's size (a "
                 "float4 needs 16 bytes, as Metal requires; a GPU faults there too) is the usual "
                 "cause, or a wild pointer";
      } else {
        append(*what, "invalid memory access at address 0x%llx (%s)", (unsigned long long)addr,
               name);
        *cause = "an out-of-bounds index is the usual cause";
      }
      return;
    }
    case SIGFPE:
      if (code == FPE_INTDIV || code == FPE_INTOVF)
        *what = "integer division by zero, or an overflowing one such as INT_MIN / -1 (SIGFPE)";
      else
        *what = "floating-point exception (SIGFPE)";
      *cause = "a GPU returns an unspecified value there; guard the divisor";
      return;
    case SIGILL:
    case SIGTRAP:
      *what = sig == SIGILL ? "illegal instruction (SIGILL)" : "trap (SIGTRAP)";
      *cause = "the compiler puts a trap where it proves undefined behaviour, such as a division "
               "by zero, and at __builtin_trap()";
      return;
    default:
      *what = "abort() was called (SIGABRT)";
      *cause = "a failed assert() calls it";
  }
}

}  // namespace
