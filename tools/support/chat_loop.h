// `nibble generate --chat`: an interactive conversation over one Session. Each user line is a
// turn; the library's ChatTurns (<nibble/chat.h>) renders and tokenizes the whole conversation
// every turn and gives only the ids past the longest common prefix the session's KV cache holds.
// Ctrl-C / SIGTERM during a reply ends it (what was generated is printed) and the chat.
#pragma once

#include <cstdio>
#include <string>

#include <nibble/chat.h>
#include <nibble/model.h>
#include <nibble/session.h>

namespace nibble_cli {

struct ChatLoopOptions {
  std::string system;              // optional system message (first in the conversation)
  std::string extra_vars_json;     // extra template variables ("" = none)
  int64_t max_new_tokens = 256;    // per reply
  nibble::SamplingOptions sampling;
  std::string prompt_marker;       // written to `out` before each user turn is read ("" = none)
  nibble::SessionOptions session;  // ctx_size and max_memory of the conversation's KV cache
};

/// Reads user turns from `in` (one line each, until EOF), prints each reply on `out` followed by
/// a newline, per-turn statistics on stderr. Returns the process exit code (errors on stderr;
/// 130 / 143 after a Ctrl-C / SIGTERM during a reply).
int RunChatLoop(const nibble::Model& model, const nibble::ChatTemplate& tmpl, const ChatLoopOptions& options,
                std::FILE* in, std::FILE* out);

}  // namespace nibble_cli
