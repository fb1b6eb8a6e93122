// The hand-off between a communicator's user (the thread that issues operations on it) and its
// watchdog (the thread that aborts it on an error or a timeout), as a small state machine:
//
//   Live --abort()--> Aborting --(users gone, or the drain limit)--> Aborted
//
// - The user issues each operation inside a Use (enter() ... its destructor); enter() on a gate
//   that is not Live throws cai::Error with the recorded reason, so after an abort every use
//   fails naming what went wrong (the operation, the group, the rank).
// - abort() runs the abort action (ncclCommAbort) at most once whoever calls it and however
//   often, and never while a Use is open: it waits for open Uses to end, up to `drain_s`. A
//   Use still open after that is blocked inside the library call that the abort exists to
//   interrupt (an NCCL call waiting for a dead peer), so the action then runs anyway.
// - with_live() runs a short query (ncclCommGetAsyncError) only while the gate is Live, never
//   concurrently with the abort action.
// The NCCL backend (nccl_internal.h's Channel) keeps one per NCCL communicator; it has no CUDA in
// it and is tested on the CPU (tests/dist/test_abort_gate.cpp).
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "cai/core/error.h"

namespace cai::dist {

class AbortGate {
 public:
  enum class State { Live, Aborting, Aborted };

  class Use {
   public:
    Use() = default;
    Use(Use&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Use& operator=(Use&&) = delete;
    Use(const Use&) = delete;
    ~Use() {
      if (gate_) gate_->leave();
    }

   private:
    friend class AbortGate;
    explicit Use(AbortGate* g) : gate_(g) {}
    AbortGate* gate_ = nullptr;
  };

  // The user, before issuing `what`: a Use while Live, else cai::Error
  // "<what>: the communicator was aborted earlier: <reason>".
  Use enter(const std::string& what) {
    std::lock_guard<std::mutex> l(mu_);
    CAI_CHECK(state_ == State::Live, "{}: the communicator was aborted earlier: {}", what, why_);
    ++users_;
    return Use(this);
  }

  // Either thread. The first call records `why`, waits for open Uses (at most drain_s seconds)
  // and runs `action` once; it returns true. Later calls return false at once (the reason stays
  // the first one).
  bool abort(const std::string& why, const std::function<void()>& action, double drain_s) {
    std::unique_lock<std::mutex> l(mu_);
    if (state_ != State::Live) return false;
    state_ = State::Aborting;
    why_ = why;
    cv_.wait_for(l, std::chrono::duration<double>(drain_s), [&] { return users_ == 0; });
    drained_ = users_ == 0;
    l.unlock();
    if (action) action();
    l.lock();
    state_ = State::Aborted;
    cv_.notify_all();
    return true;
  }

  // Runs `query` under the gate's lock while Live (returns its result), else returns `dead`.
  template <typename T, typename F>
  T with_live(F query, T dead) {
    std::lock_guard<std::mutex> l(mu_);
    return state_ == State::Live ? query() : dead;
  }

  State state() const {
    std::lock_guard<std::mutex> l(mu_);
    return state_;
  }
  bool live() const { return state() == State::Live; }
  std::string why() const {
    std::lock_guard<std::mutex> l(mu_);
    return why_;
  }
  int users() const {
    std::lock_guard<std::mutex> l(mu_);
    return users_;
  }
  // After an abort: whether every Use had ended before the action ran.
  bool drained() const {
    std::lock_guard<std::mutex> l(mu_);
    return drained_;
  }

 private:
  void leave() {
    std::lock_guard<std::mutex> l(mu_);
    --users_;
    if (users_ == 0) cv_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::Live;
  int users_ = 0;
  bool drained_ = true;
  std::string why_;
};

}  // namespace cai::dist
