// Ops that move or make data without arithmetic: reshape, copy, fill, and select_step (one time
// step of a (B, T, H) sequence) with its gradient select_step_grad.
#pragma once
