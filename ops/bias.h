// bias_add: x (B, C, ...) + bias (C), broadcast along axis 1 (a Linear's (B, N) and a conv's
// (B, C, H, W) alike); bias_grad: its gradient, the sum of dy over every axis but 1.
// The per-element sum is math::add (ops/elementwise.h), shared with the CUDA kernel.
#pragma once
