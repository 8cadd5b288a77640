"""Numbers the kernels and the host share. A leaf module: forward_plan, the variants and the
runtime all read these, so they live below every one of them and import nothing."""
from __future__ import annotations

LOG2E = 1.4426950408889634    # scores are exponentiated with exp2: scale * log2(e) folds the change of base
LN2 = 0.6931471805599453      # and LSE goes back to natural log with ln(2)
# 2^f on [0, 1) as 1 + c1 f + c2 f^2 + c3 f^3 (the FMA pipes' exponentials, softmax.fma_exp2): the cubic with p(0) = 1
# that minimises the largest relative error (a linear program on 20001 points), each coefficient a float32; in float32
# Horner the error stays below 8.6e-5 (tests/test_fma_exp2.py evaluates it as the kernel does).
EXP2_CUBIC = (0.6951172947883606, 0.22764353454113007, 0.077068030834198)
