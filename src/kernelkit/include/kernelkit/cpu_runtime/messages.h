// kernelkit/cpu_runtime/messages.h: the launch's error and the texts that explain it (part of
// libkkrt).
#pragma once

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "worker.h"

namespace {

void append(std::string& s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void append(std::string& s, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s += buf;
}

const char* kernel_name(const kk_launch_desc* d) {
  return d && d->kernel_name ? d->kernel_name : "?";
}

// Records the launch's first error.
void set_error(Launch* L, const char* msg) {
  if (L->failed.exchange(true)) return;
  size_t n = std::min(strlen(msg), kErrLen - 1);
  memcpy(L->err, msg, n);
  L->err[n] = 0;
}

// "0-15, 20, 22-23" for a sorted list; long lists are cut.
std::string ranges(const std::vector<unsigned>& v) {
  std::string s;
  int shown = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (shown == 8) {
      s += ", ...";
      break;
    }
    if (shown++) s += ", ";
    if (j == i) append(s, "%u", v[i]);
    else append(s, "%u-%u", v[i], v[j]);
    i = j + 1;
  }
  return s;
}

std::string who(const char* singular, const char* plural, const std::vector<unsigned>& v) {
  return std::string(v.size() == 1 ? singular : plural) + " " + ranges(v);
}

std::string site_text(const Fiber& f) {
  std::string s = f.op ? f.op : "?";
  if (f.file) append(s, " at %s:%u", f.file, f.line);
  else if (f.ra) append(s, " (called from %p)", f.ra);
  return s;
}

bool same_site(const Fiber& a, const Fiber& b) {
  if (a.state != b.state || a.line != b.line || a.ra != b.ra) return false;
  if (a.op != b.op && (!a.op || !b.op || strcmp(a.op, b.op))) return false;
  if (a.file != b.file && (!a.file || !b.file || strcmp(a.file, b.file))) return false;
  return true;
}

// "thread (1,0,0) of threadgroup (2,0,0), grid position (257,0,0)"
std::string thread_text(const kk_thread_ctx& t) {
  std::string s;
  append(s, "thread (%u,%u,%u) of threadgroup (%u,%u,%u), grid position (%u,%u,%u)", t.tid.x,
         t.tid.y, t.tid.z, t.gid.x, t.gid.y, t.gid.z, t.gid.x * t.tg_dispatch.x + t.tid.x,
         t.gid.y * t.tg_dispatch.y + t.tid.y, t.gid.z * t.tg_dispatch.z + t.tid.z);
  return s;
}

std::string group_text(const Worker* w) {
  std::string s;
  append(s, "threadgroup (%u,%u,%u)", w->gid.x, w->gid.y, w->gid.z);
  return s;
}

// Fibers grouped by the site they wait at, in order of first appearance.
struct Cluster {
  unsigned first;  // fiber index
  std::vector<unsigned> ids;
};

std::vector<Cluster> clusters(Worker* w, const std::vector<unsigned>& fibers) {
  std::vector<Cluster> cs;
  for (unsigned i : fibers) {
    const Fiber& f = w->fibers[i];
    const unsigned id = f.t.tindex;
    Cluster* c = nullptr;
    for (Cluster& k : cs)
      if (same_site(w->fibers[k.first], f)) c = &k;
    if (!c) {
      cs.push_back(Cluster{i, {}});
      c = &cs.back();
    }
    c->ids.push_back(id);
  }
  return cs;
}

void barrier_error(Worker* w) {
  std::vector<unsigned> fibers;
  for (unsigned i = 0; i < w->nfibers; ++i)
    if (w->fibers[i].state != kDone) fibers.push_back(i);
  std::vector<Cluster> cs = clusters(w, fibers);
  std::string msg;
  append(msg, "kernel '%s': ", kernel_name(w->d));
  msg += site_text(w->fibers[cs[0].first]) + " in " + group_text(w) + " cannot complete: " +
         who("thread", "threads", cs[0].ids) + (cs[0].ids.size() == 1 ? " waits" : " wait") +
         " there while ";
  for (size_t k = 1; k < cs.size(); ++k) {
    if (k > 1) msg += " and ";
    msg += who("thread", "threads", cs[k].ids) + (cs[k].ids.size() == 1 ? " waits at " : " wait at ") +
           site_text(w->fibers[cs[k].first]);
  }
  msg += " (threads numbered by thread_index_in_threadgroup); every live thread of a threadgroup "
         "must reach the same threadgroup_barrier (threads that have returned do not count)";
  set_error(w->launch, msg.c_str());
}

}  // namespace
