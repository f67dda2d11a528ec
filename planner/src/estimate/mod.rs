//! Memory estimates: DeepSpeed's own estimators reproduced exactly, then dsplan's full view.
