// Checks a TOML text before toml++ parses it. Debian's toml++ 3.3.0 reaches
// __builtin_unreachable() (undefined behaviour: anything may happen in a release build) when it
// asks whether a code point in U+00A1..U+0499 or U+FCFA..U+FEFE is whitespace, which it does for
// any such character where whitespace may stand: outside strings and comments (`x = 1 é`), right
// after a backslash in a basic string, and after a line-ending backslash in a multi-line one
// (found by libFuzzer; a UTF-8 byte-order mark alone took the same path). TOML allows non-ASCII
// only in strings and comments, so such texts are errors anyway: this finds them first.
#pragma once
#include <string>
#include <string_view>

namespace cai {

// The text without a leading UTF-8 byte-order mark (editors on Windows write one).
std::string_view strip_utf8_bom(std::string_view text);

// Empty if toml++ may parse `text`; else where and why not ("line 3, column 7: ...").
std::string toml_text_problem(std::string_view text);

}  // namespace cai
