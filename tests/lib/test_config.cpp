#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "memsnap/config.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::string& text, const std::string& ext = ".yaml") {
  test::TempDir dir;
  test::write_file(dir / ("c" + ext), text);
  try {
    load_config((dir / ("c" + ext)).string(), env_of({}));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreComposers) {
  const Config c = load_config("", env_of({}));
  EXPECT_EQ(c.skip_batches, 1);
  EXPECT_EQ(c.interval, 3);
  EXPECT_EQ(c.repeat, 0);
  EXPECT_FALSE(c.overwrite);
  EXPECT_EQ(c.filename, "rank{rank}.{batch}.pt.trace.memory_snapshot.html");
  EXPECT_EQ(c.stacks, StackMode::none);
}

TEST(Config, JsonFile) {
  test::TempDir dir;
  test::write_file(dir / "m.json", R"({"skip_batches": 2, "interval": "5ba", "stacks": "native", "overwrite": true,
                                      "max_entries": 1000, "repeat": -1, "run_name": "exp7"})");
  const Config c = load_config((dir / "m.json").string(), env_of({}));
  EXPECT_EQ(c.skip_batches, 2);
  EXPECT_EQ(c.interval, 5);
  EXPECT_EQ(c.stacks, StackMode::native);
  EXPECT_TRUE(c.overwrite);
  EXPECT_EQ(c.max_entries, 1000);
  EXPECT_EQ(c.repeat, -1);
  EXPECT_EQ(c.run_name, "exp7");
}

TEST(Config, ComposerTrainingYamlIsReadAsIs) {
  test::TempDir dir;
  test::write_file(dir / "train.yaml", R"(
run_name: llama-7b-fsdp
model:
  name: mpt_causal_lm
  d_model: 4096
optimizer:
  name: decoupled_adamw
  lr: 6.0e-4
callbacks:
  speed_monitor:
    window_size: 10
  memory_snapshot:
    skip_batches: 3
    interval: 2ba
    folder: "{run_name}/torch_traces"
max_duration: 10ba
)");
  const Config c = load_config((dir / "train.yaml").string(), env_of({}));
  EXPECT_EQ(c.skip_batches, 3);
  EXPECT_EQ(c.interval, 2);
  EXPECT_EQ(c.folder, "{run_name}/torch_traces");
  EXPECT_EQ(c.run_name, "llama-7b-fsdp");
}

TEST(Config, EmptyMemorySnapshotBlockMeansDefaults) {
  test::TempDir dir;
  test::write_file(dir / "t.yaml", "callbacks:\n  memory_snapshot:\n");
  const Config c = load_config((dir / "t.yaml").string(), env_of({}));
  EXPECT_EQ(c, Config{});
}

TEST(Config, EnvironmentOverridesTheFile) {
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "interval: 4\nfolder: /tmp/a\n");
  const Config c = load_config("", env_of({{"MEMSNAP_CONFIG", (dir / "m.yaml").string()},
                                           {"MEMSNAP_INTERVAL", "7"},
                                           {"MEMSNAP_OVERWRITE", "true"},
                                           {"MEMSNAP_STACKS", "native"}}));
  EXPECT_EQ(c.interval, 7);
  EXPECT_EQ(c.folder, "/tmp/a");
  EXPECT_TRUE(c.overwrite);
  EXPECT_EQ(c.stacks, StackMode::native);
}

TEST(Config, BackgroundWritesIsOnUnlessTurnedOff) {
  EXPECT_TRUE(Config{}.background_writes);
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "background_writes: false\n");
  EXPECT_FALSE(load_config((dir / "m.yaml").string(), env_of({})).background_writes);
  EXPECT_TRUE(load_config((dir / "m.yaml").string(), env_of({{"MEMSNAP_BACKGROUND_WRITES", "true"}})).background_writes);
  EXPECT_NE(error_of("background_writes: later\n").find("true or false"), std::string::npos);
}

TEST(Config, BadValueNamesKeyValueAndWhatIsAllowed) {
  const std::string e = error_of("interval: 3ep\n");
  EXPECT_NE(e.find("'interval'"), std::string::npos) << e;
  EXPECT_NE(e.find("3ep"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;

  EXPECT_NE(error_of("interval: 0\n").find("at least 1"), std::string::npos);
  EXPECT_NE(error_of("stacks: pyhton\n").find("\"none\", \"native\", \"python\" or \"all\""), std::string::npos);
  EXPECT_NE(error_of("stack_min_bytes: -1\n").find("'stack_min_bytes'"), std::string::npos);
  EXPECT_NE(error_of("torch_attachment: sometimes\n").find("true or false"), std::string::npos);
  EXPECT_NE(error_of("overwrite: maybe\n").find("true or false"), std::string::npos);
  EXPECT_NE(error_of("max_entries: -5\n").find("'max_entries'"), std::string::npos);
  EXPECT_NE(error_of("batch_marker: \"([\"\n").find("regular expression"), std::string::npos);
  EXPECT_NE(error_of("repeat: -2\n").find("'repeat'"), std::string::npos);
}

TEST(Config, UnknownKeyIsNamedWithTheKnownOnes) {
  const std::string e = error_of("skip_batchs: 2\n");
  EXPECT_NE(e.find("unknown key 'skip_batchs'"), std::string::npos) << e;
  EXPECT_NE(e.find("skip_batches"), std::string::npos) << e;
}

TEST(Config, TemplatesAreCheckedAtLoad) {
  EXPECT_NE(error_of("filename: \"rank{rnak}.html\"\n").find("unknown variable {rnak}"), std::string::npos);
  EXPECT_NE(error_of("folder: \"out/{batch}\"\n").find("{batch} is not allowed"), std::string::npos);
  EXPECT_NE(error_of("run_name: ../../etc\n").find("run_name"), std::string::npos);
}

TEST(Config, BrokenFilesAreOneLine) {
  const std::string yaml = error_of("interval: [1, 2\n");
  EXPECT_NE(yaml.find("not valid YAML"), std::string::npos) << yaml;
  const std::string json = error_of("{\"interval\": ", ".json");
  EXPECT_NE(json.find("not valid JSON"), std::string::npos) << json;
  EXPECT_NE(error_of("- 1\n- 2\n").find("mapping"), std::string::npos);
  try {
    load_config("/nonexistent/memsnap.yaml", env_of({}));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/memsnap.yaml"), std::string::npos);
  }
}

// MEMSNAP_ENABLED=false (what `memsnap run` passes to a command it does not record) wins without
// the file being read: the file may be the bad one that made memsnap run turn recording off.
TEST(Config, EnabledFalseFromTheEnvironmentWinsWithoutReadingTheFile) {
  const auto env = env_of({{"MEMSNAP_CONFIG", "/nonexistent/bad.yaml"}, {"MEMSNAP_ENABLED", "false"}});
  EXPECT_TRUE(disabled_by_environment(env));
  EXPECT_FALSE(load_config("", env).enabled);
  EXPECT_FALSE(disabled_by_environment(env_of({{"MEMSNAP_ENABLED", "yes"}})));
  EXPECT_FALSE(disabled_by_environment(env_of({})));
}

// A recording source (the CUPTI library, the PyTorch attachment, memsnap_init) with a config that
// does not load does not record, never with the defaults, and the process says so once however
// many sources ask. Told off by MEMSNAP_ENABLED it stays quiet.
TEST(Config, ARecordingProcessWithABadConfigStepsAsideAndSaysSoOnce) {
  test::TempDir dir;
  test::write_file(dir / "bad.yaml", "interval: 3ep\n");
  testing::internal::CaptureStderr();
  EXPECT_FALSE(recording_config("", env_of({{"MEMSNAP_CONFIG", (dir / "bad.yaml").string()}, {"MEMSNAP_ENABLED", "0"}})));
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "") << "quiet when told off";
  testing::internal::CaptureStderr();
  EXPECT_FALSE(recording_config("", env_of({{"MEMSNAP_CONFIG", (dir / "bad.yaml").string()}})));
  EXPECT_FALSE(recording_config((dir / "bad.yaml").string(), env_of({})));
  out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("bad.yaml: key 'interval' has value \"3ep\""), std::string::npos) << out;
  EXPECT_NE(out.find("not recorded"), std::string::npos) << out;
  const auto good = recording_config("", env_of({{"MEMSNAP_INTERVAL", "5"}}));
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(good->interval, 5);
}

TEST(Config, BadEnvironmentValueNamesTheVariable) {
  try {
    load_config("", env_of({{"MEMSNAP_SKIP_BATCHES", "two"}}));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MEMSNAP_SKIP_BATCHES"), std::string::npos) << e.what();
  }
}

TEST(Config, RoundTripsThroughJson) {
  Config c;
  c.interval = 9;
  c.stacks = StackMode::native;
  c.remote_file_name = "s3://bucket/{run_name}/{rank}.{batch}.html";
  EXPECT_EQ(config_from_json(config_to_json(c), Config{}, "test"), c);
}

// The known keys, the parser and the dump are made from one table (config.cpp): the dump holds
// every known key, in the same set, and each stack mode goes through parse and dump.
TEST(Config, KeysParseAndDumpAgree) {
  const nlohmann::json dumped = config_to_json(Config{});
  std::vector<std::string> dumped_keys;
  for (const auto& [key, value] : dumped.items()) dumped_keys.push_back(key);
  std::vector<std::string> known = config_keys();
  std::sort(known.begin(), known.end());
  EXPECT_EQ(dumped_keys, known);
  for (StackMode m : {StackMode::none, StackMode::native, StackMode::python, StackMode::all}) {
    Config c;
    c.stacks = m;
    EXPECT_EQ(config_from_json(config_to_json(c), Config{}, "test").stacks, m);
  }
}

}  // namespace
}  // namespace memsnap
