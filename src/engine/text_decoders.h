// The engine's TextDecoders for a real model: the tokenizer's StreamingDetokenizer, or (a server
// without a tokenizer, --skip-tokenizer-init) decoders that release no text. The server and the
// engine benchmark build their engines with these.
#pragma once

#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

// Decoders backed by StreamingDetokenizer over `tokenizer` (which must outlive them).
TextDecoderFactory streaming_decoders(const Tokenizer& tokenizer);

// Decoders that release no text (--skip-tokenizer-init: the server returns token ids).
TextDecoderFactory no_text_decoders();

}  // namespace megadecode
