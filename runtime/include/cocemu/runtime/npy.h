#pragma once
/// NumPy .npy files (format 1.0/2.0, C order, little-endian): float32, float64, int32, int8,
/// uint8 and bool, so inputs and results can be compared with NumPy or PyTorch.
#include <cstdint>
#include <string>
#include <string_view>

#include "cocemu/runtime/tensor.h"

namespace cocemu {

/// Reads an .npy file; uint8 and bool arrays load as i8. Errors name the file and what is wrong;
/// the header is parsed strictly and the declared size checked against the file before any
/// allocation.
Tensor read_npy(const std::string& path);
/// The same from the file's bytes (`name` names it in errors).
Tensor parse_npy(std::string_view bytes, const std::string& name);
/// NaN and ±Inf elements of a floating tensor.
std::int64_t count_non_finite(const Tensor& tensor);
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace cocemu
