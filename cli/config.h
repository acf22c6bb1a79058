// cli/config.h — the run configuration of the `lockstep` command read from TOML and the command
// line: rl/run_config.h's structs, one per TOML section, with their defaults.
//
// Sources, each overriding the one before: the defaults (rl/run_config.h), the TOML file, then command-line
// options `--section.key=value` or `--section.key value`. An option's value is a TOML value
// (`--rollout.top_p=0.9`, `--rollout.stop='["\n\n"]'`); for a string key an unquoted value is taken
// verbatim (`--data.train=data/gsm8k.jsonl`), a quoted one as a TOML string.
//
// Every key is checked as it is read, and a bad one fails with one lockstep::Error that says where
// (`file:line`, or the option) and what was expected:
//   - unknown section or key: names it and suggests the closest known keys ("did you mean
//     rollout.temperature?");
//   - wrong TOML type: names the key, the expected type and the value given (an integer is accepted
//     for a float key; a float is not accepted for an integer key);
//   - value out of range or not one of the allowed strings: names the key, the value and the range
//     or the allowed values;
//   - TOML syntax error: toml++'s description with file:line:column.
// After all sources, keys that constrain each other are checked together (optim.min_lr ≤
// optim.lr; loss.adaptive_clip needs loss.tis_cap > 0; loss.tis_cap cannot act with
// loss.reuse_rollout_logprobs; loss.overlong_buffer ≤ rollout.max_new_tokens; rollout.exact
// cannot hold with model.precision = "fp8-rollout"). rollout.exact = true sets
// loss.reuse_rollout_logprobs = true unless a source sets that key itself.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "rl/run_config.h"

namespace lockstep {

// Defaults, then `file` (when not null), then `overrides` (the command line's options, in order; a
// later one wins). Throws lockstep::Error as described above.
Config load_config(const std::filesystem::path* file, std::span<const std::string> overrides);

// The keys a subcommand reads ("train", "sft", "eval", "generate", "export", "plot"), section by section:
// each with its type and allowed values, its default and a one-line description. An empty
// subcommand lists every section. An unknown subcommand is an error naming the known ones.
std::string config_help(std::string_view subcommand);

// Every key of `config` as TOML, sections and keys in schema order, each key commented with its
// description; load_config of this text gives back `config` exactly.
std::string to_toml(const Config& config);

}  // namespace lockstep
