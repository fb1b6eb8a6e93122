// `colossalai check -i`: build and runtime compatibility report.
#pragma once
#include <CLI/CLI.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace cai::app {

struct CheckOptions {
  bool installation = false;  // -i
};

enum class Verdict { Ok, Fail, NotApplicable };

struct CheckRow {
  std::string component;
  std::string value;
  Verdict verdict;
  std::string note;
};

// Collects the rows; `usable` is false when a row that training needs failed.
std::vector<CheckRow> collect_installation_report(const std::string& self_dir, bool* usable);
void print_report(const std::vector<CheckRow>& rows, std::ostream& os);

void setup_check(CLI::App& app, CheckOptions& opts);
int run_check(const CheckOptions& opts, const std::string& self_dir);

}  // namespace cai::app
