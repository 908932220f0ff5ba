// MPI baseline: MPI_Allgather, MPI_Reduce_scatter_block (float sum),
// MPI_Alltoall and MPI_Reduce (float sum to rank 0), measured and printed exactly like our *_perf binaries.
//   mpirun --allow-run-as-root --oversubscribe -np 4 mpi_coll_bench --coll all_gather -b 1M -e 64M
// Pick the Open MPI path with mpirun flags (e.g. --mca pml ob1 --mca btl tcp,self);
// --transport only labels the output.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "perf/baselines/baseline.h"

namespace {
using namespace attnperf;

void mpiCheck(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(msg, size_t(len)));
}

class MpiBackend : public Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &n_);
    // Errors come back as codes (then exceptions), not aborts.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return n_; }
  std::string library() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, strnlen(v, size_t(len)));
    return s.substr(0, s.find_first_of(",\n"));  // "Open MPI v4.1.4"
  }
  void barrier() override { mpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  void maxInPlace(double* v, size_t n) override {
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, v, int(n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
             "MPI_Allreduce");
  }
  int64_t sum(int64_t v) override {
    int64_t out = 0;
    mpiCheck(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    return out;
  }
  std::vector<RankInfo> gatherRankInfo(const RankInfo& mine) override {
    std::vector<RankInfo> all(static_cast<size_t>(n_));
    mpiCheck(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE,
                           MPI_COMM_WORLD),
             "MPI_Allgather");
    return all;
  }
  BaselineOp prepare(const std::string& coll, float* s, float* r, size_t count) override {
    const int c = int(count);
    BaselineOp op;
    op.result = r;
    if (coll == "all_gather")
      op.call = [=] {
        mpiCheck(MPI_Allgather(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Allgather");
      };
    else if (coll == "reduce_scatter")
      op.call = [=] {
        mpiCheck(MPI_Reduce_scatter_block(s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                 "MPI_Reduce_scatter_block");
      };
    else if (coll == "reduce")
      op.call = [=] {
        mpiCheck(MPI_Reduce(s, r, c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD), "MPI_Reduce");
      };
    else if (coll == "all_reduce")
      op.call = [=] {
        mpiCheck(MPI_Allreduce(s, r, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
      };
    else if (coll == "broadcast") {
      // MPI_Bcast has one buffer: the root's send buffer, every other
      // rank's receives (it holds -1s until the first call).
      op.result = s;
      op.call = [=] { mpiCheck(MPI_Bcast(s, c, MPI_FLOAT, 0, MPI_COMM_WORLD), "MPI_Bcast"); };
    }
    else
      op.call = [=] {
        mpiCheck(MPI_Alltoall(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Alltoall");
      };
    return op;
  }

 private:
  int rank_ = 0, n_ = 1;
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Options o;
  o.coll = "all_gather";
  int code = 0;
  if (!parseOptions(argc, argv, &o, &code)) {
    MPI_Finalize();
    return code;
  }
  if (!baselineOptionsOk(o)) {
    MPI_Finalize();
    return 2;
  }
  int rc = 0;
  try {
    MpiBackend be;
    rc = runBaseline(be, o, "mpi_coll_bench", "mpirun processes", o.transports) ? 1 : 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "mpi_coll_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}
