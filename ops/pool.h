// max_pool2d: x (B, C, H, W) -> y (B, C, OH, OW), argmax (B, C, OH, OW) int32; attrs kernel and
// stride, no padding. Ties go to the first maximum in row-major window order, so the gradient
// (max_pool2d_grad, which routes dy to the recorded argmax) is deterministic.
#pragma once
