// Helpers that the launcher (cmd_run.cpp, cmd_run_plan.cpp) and the rank wrapper
// (rank_wrapper.cpp) share; not part of cmd_run.h's interface.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace cai::app::detail {

extern const char* const kWrapperCommand;  // "_rank_wrapper"
bool parse_int(const std::string& s, long* out);
// argv for exec: pointers into `v` (which must outlive them), null-terminated.
std::vector<char*> c_argv(std::vector<std::string>& v);
void write_all(int fd, const char* p, size_t n);  // all of it, retrying EINTR
void say(const std::string& msg);                 // one line to stderr, unbuffered
int exit_code_of(int status);                     // waitpid status -> shell exit code
std::string join(const std::vector<std::string>& v, const char* sep);  // v[0] sep v[1] ...

}  // namespace cai::app::detail
