// ptx/src/decode.h — an instruction's opcode text ("ld.global.v4.f32", "setp.lt.s32", ...) to the
// fields of an Ins (ir.h): operation, types, state space, comparison, rounding and the other
// modifiers. Private to ptx/src: the parser (parse.cpp) decodes each instruction with it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir.h"

namespace orion::ptx::detail {

// Opcode text -> Ins fields. False, with `why` ("modifier .foo", "bulk copies (TMA)"; empty for
// an opcode the executor does not know at all), for what the executor does not implement.
bool Decode(const std::string& text, Ins* ins, std::string* why);
// Converts float immediates to the float width of the operand they stand for (after the operands
// are parsed).
void FixImmediates(Ins* ins);

// The pieces of the decoding the parser uses too: a type, comparison or rounding modifier's value
// (nullopt: not one), and an opcode split at its dots.
std::optional<Ty> TypeOf(std::string_view m);
std::optional<Cmp> CmpOf(std::string_view m);
std::optional<Rnd> RndOf(std::string_view m);
std::vector<std::string_view> SplitDots(std::string_view s);

}  // namespace orion::ptx::detail
