// fsdp_sim: a CPU program that allocates like one rank of an FSDP training job and reports every
// allocation through memsnap's C API. No GPU and no MPI: rank and world size come from the
// launcher's environment, so `mpirun -np 4 fsdp_sim` (or srun, torchrun) runs 4 ranks.
//
// Per rank: a 1/N shard of each layer's flat parameters, gradients and Adam state; per batch an
// all-gather buffer around every layer's forward and backward, activations that depend on the
// sequence length, an unsharded gradient reduce-scattered into the shard, an optimizer step.
// Options plant what a user hunts for: one rank that keeps a module unsharded, one that leaks a
// buffer every batch, one that sees a long sequence on one batch, one that hits OOM.
//
// Memory is simulated by a small caching allocator (segments carved into blocks, never returned),
// so the record has both allocated and reserved memory, like PyTorch's.
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "memsnap/launch_env.hpp"
#include "memsnap/memsnap.h"

namespace {

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

// A caching allocator in miniature: first fit in existing segments, else a new segment.
class CachingAllocator {
 public:
  CachingAllocator(int device, std::uint64_t capacity) : device_(device), capacity_(capacity) {}

  // Returns the address, or nullopt (after recording the OOM) when the device is full.
  std::optional<std::uint64_t> alloc(std::uint64_t bytes) {
    const std::uint64_t size = round_up(std::max<std::uint64_t>(bytes, 1), 512);
    for (auto& seg : segments_) {
      for (auto it = seg.free.begin(); it != seg.free.end(); ++it) {
        if (it->second < size) continue;
        const std::uint64_t addr = it->first;
        const std::uint64_t left = it->second - size;
        seg.free.erase(it);
        if (left > 0) seg.free.emplace(addr + size, left);
        return finish(addr, size);
      }
    }
    const std::uint64_t seg_size = size <= MiB ? 2 * MiB : round_up(size, 20 * MiB);
    if (reserved_ + seg_size > capacity_) {
      memsnap_record_oom(device_, bytes, capacity_ - reserved_, capacity_, 0);
      return std::nullopt;
    }
    Segment seg{next_segment_, seg_size, {}};
    next_segment_ += round_up(seg_size, GiB);  // segments far apart, like real device addresses
    reserved_ += seg_size;
    memsnap_record(MEMSNAP_SEGMENT_ALLOC, device_, seg.addr, seg.size, 0);
    if (seg_size > size) seg.free.emplace(seg.addr + size, seg_size - size);
    segments_.push_back(std::move(seg));
    return finish(segments_.back().addr, size);
  }

  void free(std::uint64_t addr) {
    auto it = sizes_.find(addr);
    if (it == sizes_.end()) return;
    const std::uint64_t size = it->second;
    sizes_.erase(it);
    memsnap_record_free(device_, addr, size, 0);
    for (auto& seg : segments_) {
      if (addr < seg.addr || addr >= seg.addr + seg.size) continue;
      auto [pos, inserted] = seg.free.emplace(addr, size);
      // Coalesce with the free neighbours.
      if (auto next = std::next(pos); next != seg.free.end() && pos->first + pos->second == next->first) {
        pos->second += next->second;
        seg.free.erase(next);
      }
      if (pos != seg.free.begin()) {
        auto prev = std::prev(pos);
        if (prev->first + prev->second == pos->first) {
          prev->second += pos->second;
          seg.free.erase(pos);
        }
      }
      return;
    }
  }

  std::uint64_t allocated() const { return allocated_; }

 private:
  struct Segment {
    std::uint64_t addr, size;
    std::map<std::uint64_t, std::uint64_t> free;  // offset -> size
  };
  std::uint64_t finish(std::uint64_t addr, std::uint64_t size) {
    sizes_[addr] = size;
    allocated_ += size;
    memsnap_record_alloc(device_, addr, size, 0);
    return addr;
  }
  int device_;
  std::uint64_t capacity_;
  std::uint64_t reserved_ = 0, allocated_ = 0;
  std::uint64_t next_segment_ = 0x7f0000000000ull;
  std::vector<Segment> segments_;
  std::map<std::uint64_t, std::uint64_t> sizes_;
};

struct Options {
  int batches = 8;
  int layers = 8;
  std::uint64_t hidden = 1024;
  std::uint64_t seq = 1024;
  std::uint64_t micro_batch = 4;
  int unsharded_rank = -1;
  int leak_rank = -1;
  std::uint64_t leak_mib = 64;
  int spike_rank = -1, spike_batch = -1;
  int oom_rank = -1, oom_batch = -1;
  int kill_rank = -1, kill_batch = -1;
  std::uint64_t device_gib = 80;
  int step_us = 200;
  std::string config;
};

// The functions below are the allocation sites a report names; keep them out of line so native
// stacks show them.
class FsdpSim {
 public:
  FsdpSim(const Options& o, int rank, int world)
      : o_(o), rank_(rank), world_(world), mem_(0, o.device_gib * GiB) {}

  [[gnu::noinline]] void init_sharded_params() {
    for (int l = 0; l < o_.layers; ++l) {
      // Rank `unsharded_rank` keeps layer 0 (its "embedding") whole instead of its shard.
      const std::uint64_t bytes = (rank_ == o_.unsharded_rank && l == 0) ? layer_params() : shard_bytes();
      if (rank_ == o_.unsharded_rank && l == 0) {
        shards_.push_back(init_unsharded_module(bytes));
      } else {
        shards_.push_back(must(mem_.alloc(bytes)));
      }
    }
  }

  [[gnu::noinline]] std::uint64_t init_unsharded_module(std::uint64_t bytes) { return must(mem_.alloc(bytes)); }

  // One training batch. Returns false when the batch hit OOM (the job skips it, as Composer's
  // automatic microbatching would).
  [[gnu::noinline]] bool train_batch(int batch) {
    const std::uint64_t seq = (rank_ == o_.spike_rank && batch == o_.spike_batch) ? o_.seq * 4 : o_.seq;
    std::vector<std::uint64_t> acts;
    for (int l = 0; l < o_.layers; ++l) {
      const std::uint64_t full = all_gather_params();
      if (rank_ == o_.oom_rank && batch == o_.oom_batch && l == o_.layers / 2) {
        if (!forward_activations(o_.device_gib * GiB)) {  // an allocation that cannot fit
          mem_.free(full);
          for (auto a : acts) mem_.free(a);
          return false;
        }
      }
      auto act = forward_activations(activation_bytes(seq));
      if (!act) return false;
      acts.push_back(*act);
      mem_.free(full);  // reshard after forward
      pause();
    }
    for (int l = o_.layers - 1; l >= 0; --l) {
      const std::uint64_t full = all_gather_params();
      const std::uint64_t grad = backward_unsharded_grad();
      reduce_scatter_grads(l);
      mem_.free(grad);
      mem_.free(full);
      mem_.free(acts[l]);
      pause();
    }
    optimizer_step();
    if (rank_ == o_.leak_rank) leaked_.push_back(cache_batch_metrics());
    return true;
  }

 private:
  [[gnu::noinline]] std::uint64_t all_gather_params() { return must(mem_.alloc(layer_params())); }
  [[gnu::noinline]] std::optional<std::uint64_t> forward_activations(std::uint64_t bytes) { return mem_.alloc(bytes); }
  [[gnu::noinline]] std::uint64_t backward_unsharded_grad() { return must(mem_.alloc(layer_params())); }
  [[gnu::noinline]] void reduce_scatter_grads(int layer) {
    if (grads_.size() < static_cast<std::size_t>(o_.layers)) grads_.resize(o_.layers, 0);
    if (grads_[layer] == 0) grads_[layer] = accumulate_grad_shard();
  }
  [[gnu::noinline]] std::uint64_t accumulate_grad_shard() { return must(mem_.alloc(shard_bytes())); }
  [[gnu::noinline]] void optimizer_step() {
    if (optim_.empty()) init_optimizer_state();
    const std::uint64_t tmp = must(mem_.alloc(shard_bytes() * 2));  // fp32 update buffer
    mem_.free(tmp);
  }
  [[gnu::noinline]] void init_optimizer_state() {
    for (int l = 0; l < o_.layers; ++l) {
      optim_.push_back(must(mem_.alloc(shard_bytes() * 2)));  // Adam exp_avg (fp32)
      optim_.push_back(must(mem_.alloc(shard_bytes() * 2)));  // Adam exp_avg_sq (fp32)
    }
  }
  [[gnu::noinline]] std::uint64_t cache_batch_metrics() { return must(mem_.alloc(o_.leak_mib * MiB)); }

  std::uint64_t layer_params() const { return 12 * o_.hidden * o_.hidden * 2; }  // bf16 weights of a block
  std::uint64_t shard_bytes() const { return round_up(layer_params(), world_) / world_; }
  std::uint64_t activation_bytes(std::uint64_t seq) const { return o_.micro_batch * seq * o_.hidden * 2 * 8; }
  std::uint64_t must(std::optional<std::uint64_t> addr) {
    if (!addr) {
      std::fprintf(stderr, "fsdp_sim rank %d: simulated device is full; use a larger --device-gib\n", rank_);
      std::exit(1);
    }
    return *addr;
  }
  void pause() const {
    if (o_.step_us > 0) usleep(static_cast<useconds_t>(o_.step_us));
  }

  const Options& o_;
  int rank_, world_;
  CachingAllocator mem_;
  std::vector<std::uint64_t> shards_, grads_, optim_, leaked_;
};

bool parse_pair(const std::string& text, int& a, int& b) {
  return std::sscanf(text.c_str(), "%d:%d", &a, &b) == 2 && a >= 0 && b >= 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string spike, oom, kill_at;
  CLI::App app{"fsdp_sim: allocates like one rank of an FSDP training job, recorded by memsnap"};
  app.add_option("--batches", o.batches, "batches to train")->check(CLI::Range(1, 1000000));
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", o.hidden, "hidden size (parameters per block: 12 * hidden^2, bf16)")->check(CLI::Range(8, 65536));
  app.add_option("--seq", o.seq, "sequence length")->check(CLI::Range(1, 1 << 22));
  app.add_option("--micro-batch", o.micro_batch, "sequences per batch")->check(CLI::Range(1, 4096));
  app.add_option("--unsharded-rank", o.unsharded_rank, "this rank keeps layer 0 unsharded (shard imbalance)");
  app.add_option("--leak-rank", o.leak_rank, "this rank retains a buffer every batch (leak)");
  app.add_option("--leak-mib", o.leak_mib, "size of the leaked buffer in MiB")->check(CLI::Range(1, 1 << 20));
  app.add_option("--spike", spike, "R:B: rank R sees a 4x longer sequence on batch B (spike)");
  app.add_option("--oom", oom, "R:B: rank R runs out of memory on batch B");
  app.add_option("--kill", kill_at, "R:B: rank R is killed with SIGKILL in batch B (as the OOM killer would)");
  app.add_option("--device-gib", o.device_gib, "simulated device memory in GiB")->check(CLI::Range(1, 1 << 16));
  app.add_option("--step-us", o.step_us, "pause after each layer, microseconds (spreads the timeline)")->check(CLI::Range(0, 1000000));
  app.add_option("--config", o.config, "memsnap config file (default: $MEMSNAP_CONFIG)");
  CLI11_PARSE(app, argc, argv);
  if (!spike.empty() && !parse_pair(spike, o.spike_rank, o.spike_batch)) {
    std::fprintf(stderr, "fsdp_sim: --spike wants RANK:BATCH (e.g. 1:5), not '%s'\n", spike.c_str());
    return 2;
  }
  if (!oom.empty() && !parse_pair(oom, o.oom_rank, o.oom_batch)) {
    std::fprintf(stderr, "fsdp_sim: --oom wants RANK:BATCH (e.g. 3:6), not '%s'\n", oom.c_str());
    return 2;
  }

  if (!kill_at.empty() && !parse_pair(kill_at, o.kill_rank, o.kill_batch)) {
    std::fprintf(stderr, "fsdp_sim: --kill wants RANK:BATCH (e.g. 2:3), not '%s'\n", kill_at.c_str());
    return 2;
  }

  const memsnap::LaunchInfo launch = memsnap::detect_launch(memsnap::process_env());
  memsnap_init(o.config.empty() ? nullptr : o.config.c_str());

  FsdpSim sim(o, launch.rank, launch.world_size);
  sim.init_sharded_params();
  int skipped = 0;
  for (int b = 1; b <= o.batches; ++b) {
    if (launch.rank == o.kill_rank && b == o.kill_batch) {
      sim.train_batch(b);  // halfway through the window's batches, then gone
      raise(SIGKILL);
    }
    if (!sim.train_batch(b)) {
      std::fprintf(stderr, "fsdp_sim rank %d: out of memory in batch %d; skipping the batch\n", launch.rank, b);
      ++skipped;
    }
    memsnap_step();
  }
  memsnap_shutdown();
  std::printf("fsdp_sim rank %d/%d: %d batches (%d skipped after OOM)\n", launch.rank, launch.world_size, o.batches, skipped);
  return 0;
}
