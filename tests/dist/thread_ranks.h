// tests/dist/thread_ranks.h — N ranks as N threads of one process, for tests that need a number
// of ranks other than the one mpirun gave (a checkpoint written by 2 ranks and read by 3). CPU
// tensors only; sums in rank order, ((t₀ + t₁) + t₂) + …, as dist/mpi_communicator.h's CPU path,
// so the bits are those of N MPI ranks.
#pragma once

#include <barrier>
#include <cstdlib>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace lockstep::testing {

class ThreadRanks {
 public:
  // Runs fn(comm) on `n` threads, one rank each; returns when all are done. An exception on one
  // thread is rethrown here (the others must not wait for it in a collective: tests keep their
  // collectives unconditional).
  static void run(int n, const std::function<void(Communicator&)>& fn) {
    ThreadRanks group(n);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        Rank comm(group, r);
        try {
          fn(comm);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  explicit ThreadRanks(int n) : n_(n), sync_(n), slots_(size_t(n)), rows_(size_t(n)) {}

  class Rank final : public Communicator {
   public:
    Rank(ThreadRanks& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_.n_; }
    int local_rank() const override { return rank_; }

    void all_reduce_sum(Tensor& t, CommStream) override {
      check_all_reduce(*this, t);
      Tensor sum = Tensor::empty(t.shape(), t.dtype());
      exchange(&t, [&] { sum_rows(sum, 0, t.numel()); });
      t.copy_from(sum);
      g_.sync_.arrive_and_wait();
    }
    void all_gather(const Tensor& shard, Tensor& full, CommStream) override {
      check_all_gather(*this, shard, full);
      exchange(&shard, [&] {
        for (int r = 0; r < g_.n_; ++r) full.rows(r * shard.dim(0), (r + 1) * shard.dim(0)).copy_from(*g_.slots_[size_t(r)]);
      });
    }
    void reduce_scatter_sum(const Tensor& full, Tensor& shard, CommStream) override {
      check_reduce_scatter(*this, full, shard);
      exchange(&full, [&] { sum_rows(shard, rank_ * shard.numel(), shard.numel()); });
    }
    void broadcast(Tensor& t, int root, CommStream) override {
      check_broadcast(*this, t, root);
      Tensor copy = Tensor::empty(t.shape(), t.dtype());
      exchange(&t, [&] { copy.copy_from(*g_.slots_[size_t(root)]); });
      t.copy_from(copy);
      g_.sync_.arrive_and_wait();
    }
    void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                    std::span<const int64_t> recv_rows, CommStream) override {
      check_all_to_all(*this, send, send_rows, recv, recv_rows);
      g_.rows_[size_t(rank_)] = send_rows;
      exchange(&send, [&] {
        // Rank q's rows for this rank start after its rows for the ranks before this one.
        for (int q = 0, at = 0; q < g_.n_; at += int(recv_rows[size_t(q)]), ++q) {
          const std::span<const int64_t> theirs = g_.rows_[size_t(q)];
          int64_t from = 0;
          for (int p = 0; p < rank_; ++p) from += theirs[size_t(p)];
          recv.rows(at, at + recv_rows[size_t(q)]).copy_from(g_.slots_[size_t(q)]->rows(from, from + theirs[size_t(rank_)]));
        }
      });
    }
    void barrier() override { g_.sync_.arrive_and_wait(); }
    [[noreturn]] void abort(int exit_code) override { std::exit(exit_code); }

   private:
    // Publishes `mine`, runs `read` once every rank has, and returns once every rank has read.
    void exchange(const Tensor* mine, const std::function<void()>& read) {
      g_.slots_[size_t(rank_)] = mine;
      g_.sync_.arrive_and_wait();
      read();
      g_.sync_.arrive_and_wait();
    }
    // out[i] = Σ_r (rank r's tensor, flat)[begin + i], in rank order.
    void sum_rows(Tensor& out, int64_t begin, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        if (out.dtype() == DType::f64) {
          double s = g_.slots_[0]->data_as<double>()[begin + i];
          for (int r = 1; r < g_.n_; ++r) s += g_.slots_[size_t(r)]->data_as<double>()[begin + i];
          out.data_as<double>()[i] = s;
        } else {
          float s = g_.slots_[0]->data_as<float>()[begin + i];
          for (int r = 1; r < g_.n_; ++r) s += g_.slots_[size_t(r)]->data_as<float>()[begin + i];
          out.data_as<float>()[i] = s;
        }
      }
    }
    ThreadRanks& g_;
    int rank_;
  };

  int n_;
  std::barrier<> sync_;
  std::vector<const Tensor*> slots_;
  std::vector<std::span<const int64_t>> rows_;  // all_to_all's send_rows of each rank
};

}  // namespace lockstep::testing
