"""Numbers the kernels and the host share. A leaf module: forward_plan, the variants and the
runtime all read these, so they live below every one of them and import nothing."""
from __future__ import annotations

LOG2E = 1.4426950408889634    # scores are exponentiated with exp2: scale * log2(e) folds the change of base
LN2 = 0.6931471805599453      # and LSE goes back to natural log with ln(2)
