// cai::Error and CAI_CHECK (shared with the kernels): the library throws, only apps exit.
#pragma once
#include "kernels/base/error.h"
