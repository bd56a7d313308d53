#pragma once
/// NumPy .npy files (format 1.0/2.0, C order, little-endian): float32, float64, int32, int8,
/// uint8 and bool, so inputs and results can be compared with NumPy or PyTorch.
#include <string>

#include "cocemu/runtime/tensor.h"

namespace cocemu {

/// Reads an .npy file; uint8 and bool arrays load as i8. Errors name the file and what is wrong.
Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace cocemu
