// ops/cuda/cublas_check.h — every cuBLAS and cuBLASLt call is checked; a failure throws with the
// status, the call, the file and the line. Include only from CUDA sources.
#pragma once

#include <cublas_api.h>

#include "core/error.h"

#define LOCKSTEP_CUBLAS_CHECK(call)                                                          \
  do {                                                                                       \
    cublasStatus_t lockstep_st_ = (call);                                                    \
    if (lockstep_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      throw ::lockstep::Error(::lockstep::detail::concat("cuBLAS error ",                    \
                                                         cublasGetStatusName(lockstep_st_),  \
                                                         " in ", #call, " at ", __FILE__,    \
                                                         ":", __LINE__));                    \
  } while (0)
