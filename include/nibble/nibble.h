// nibble public C++ API: load a Hugging Face Llama-family checkpoint (dense or quantized), run
// sessions that generate text, measure perplexity and compare models, and quantize checkpoints.
// Errors are values (Result / Status, <nibble/error.h>) whose messages name the file, tensor or
// key involved and whose codes say what kind of failure it is.
#pragma once

#include <nibble/cancel.h>
#include <nibble/chat.h>
#include <nibble/checkpoint.h>
#include <nibble/error.h>
#include <nibble/eval.h>
#include <nibble/generate.h>
#include <nibble/model.h>
#include <nibble/prefix_cache.h>
#include <nibble/quantize.h>
#include <nibble/session.h>
#include <nibble/stop_strings.h>
#include <nibble/tokenizer.h>
