#include <gtest/gtest.h>

#include "memsnap/launch_env.hpp"
#include "memsnap/names.hpp"

#include <map>

namespace memsnap {
namespace {

TEST(Names, EveryVariable) {
  NameVars v{"run", 3, 1, 8, 4, 2, 12, "20261202-101010"};
  EXPECT_EQ(format_name("{run_name}/r{rank}.l{local_rank}.w{world_size}.lw{local_world_size}.n{node_rank}.b{batch}.{timestamp}", v),
            "run/r3.l1.w8.lw4.n2.b12.20261202-101010");
  EXPECT_EQ(format_name("rank{rank}.{batch}.pt.trace.memory_snapshot.html", v), "rank3.12.pt.trace.memory_snapshot.html");
  EXPECT_EQ(format_name("{{literal}}", v), "{literal}");
}

TEST(Names, UnknownVariableAndBadBracesAreErrors) {
  NameVars v;
  EXPECT_THROW(format_name("{rank}{epoch}", v), NameError);
  EXPECT_THROW(format_name("{rank", v), NameError);
  EXPECT_THROW(format_name("rank}", v), NameError);
  EXPECT_THROW(format_name("{batch}", v), NameError) << "no batch known";
  EXPECT_THROW(check_template("{bogus}", true, "filename"), NameError);
  EXPECT_NO_THROW(check_template("{run_name}/{rank}", false, "folder"));
}

TEST(Names, FormattedNamesStayInsideTheFolder) {
  EXPECT_EQ(join_inside("/out", "a/b.html"), std::filesystem::path("/out/a/b.html"));
  EXPECT_THROW(join_inside("/out", "../x.html"), NameError);
  EXPECT_THROW(join_inside("/out", "a/../../x.html"), NameError);
  EXPECT_THROW(join_inside("/out", "/etc/passwd"), NameError);
  EXPECT_THROW(join_inside("/out", ""), NameError);
  EXPECT_THROW(check_run_name("../up"), NameError);
  EXPECT_THROW(check_run_name("a/b"), NameError);
  EXPECT_THROW(check_run_name(".."), NameError);
  EXPECT_THROW(check_run_name(""), NameError);
  EXPECT_NO_THROW(check_run_name("llama-7b_run.3"));
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnv, OpenMpi) {
  auto i = detect_launch(env_of({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_NODE_RANK", "1"}}));
  EXPECT_EQ(i.launcher, "openmpi");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_world_size, 4);
  EXPECT_EQ(i.node_rank, 1);
}

TEST(LaunchEnv, Slurm) {
  auto i = detect_launch(env_of({{"SLURM_PROCID", "9"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "16"},
                                 {"SLURM_NTASKS_PER_NODE", "8"}, {"SLURM_NODEID", "1"}, {"SLURM_JOB_ID", "4242"}}));
  EXPECT_EQ(i.launcher, "slurm");
  EXPECT_EQ(i.rank, 9);
  EXPECT_EQ(i.world_size, 16);
  EXPECT_EQ(i.local_world_size, 8);
  EXPECT_EQ(i.node_rank, 1);
  EXPECT_EQ(default_run_name(i), "job-4242");
}

TEST(LaunchEnv, TorchrunWinsOverTheOuterLauncher) {
  auto i = detect_launch(env_of({{"RANK", "3"}, {"LOCAL_RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "4"},
                                 {"GROUP_RANK", "0"}, {"SLURM_PROCID", "0"}, {"TORCHELASTIC_RUN_ID", "abc/1"}}));
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(default_run_name(i), "job-abc_1") << "a job id never makes a path";
}

TEST(LaunchEnv, PmixAndNone) {
  auto p = detect_launch(env_of({{"PMIX_RANK", "2"}}));
  EXPECT_EQ(p.launcher, "pmix");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 3) << "at least rank + 1";
  auto n = detect_launch(env_of({{"RANK", "garbage"}}));
  EXPECT_EQ(n.launcher, "none");
  EXPECT_EQ(n.rank, 0);
  EXPECT_EQ(n.world_size, 1);
  EXPECT_EQ(default_run_name(n), "memsnap");
}

}  // namespace
}  // namespace memsnap
