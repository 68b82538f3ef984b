// The worker that runs a rank's bucketed collectives (dist/collective_queue.h): tasks run in the
// order they were queued, on one thread that is not the caller's, after its start hook; a task's
// exception reaches wait_all once and the tasks after it are skipped; the destructor drains.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dist/collective_queue.h"

namespace parity {
namespace {

TEST(CollectiveQueue, RunsTasksInOrderOnItsOwnThreadAfterItsStartHook) {
  std::thread::id started, caller = std::this_thread::get_id();
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  {
    CollectiveQueue q([&] { started = std::this_thread::get_id(); });
    for (int i = 0; i < 50; ++i) {
      const std::int64_t ticket = q.submit([&, i] {
        if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
      });
      EXPECT_EQ(ticket, i + 1);
    }
    q.wait_all();
    EXPECT_EQ(q.pending(), 0);
    ASSERT_EQ(order.size(), 50u);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
    for (const auto& t : threads) EXPECT_EQ(t, started);
    EXPECT_NE(started, caller);
    // The caller goes on while a task runs.
    std::atomic<bool> release{false};
    q.submit([&] {
      while (!release) std::this_thread::yield();
    });
    EXPECT_EQ(q.pending(), 1);
    release = true;
    q.wait_all();
  }
}

TEST(CollectiveQueue, AFailedTaskReachesWaitAllOnceAndTheRestIsSkipped) {
  CollectiveQueue q;
  int ran = 0;
  q.submit([&] { ++ran; });
  q.submit([] { throw std::runtime_error("collective 2 failed"); });
  q.submit([&] { ++ran; });  // after the failure: skipped
  try {
    q.wait_all();
    ADD_FAILURE() << "the failure was not raised";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "collective 2 failed");
  }
  EXPECT_EQ(ran, 1);
  q.wait_all();  // raised once
  q.submit([&] { ++ran; });
  q.wait_all();
  EXPECT_EQ(ran, 2);
}

TEST(CollectiveQueue, TheDestructorDrainsWhatWasQueued) {
  std::atomic<int> ran{0};
  {
    CollectiveQueue q;
    for (int i = 0; i < 20; ++i)
      q.submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++ran;
      });
  }
  EXPECT_EQ(ran.load(), 20);
}

TEST(CollectiveQueue, AStartHookThatThrowsFailsTheFirstWait) {
  CollectiveQueue q([] { throw std::runtime_error("no device"); });
  int ran = 0;
  q.submit([&] { ++ran; });
  EXPECT_THROW(q.wait_all(), std::runtime_error);
  EXPECT_EQ(ran, 0);
}

}  // namespace
}  // namespace parity
