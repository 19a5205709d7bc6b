#include "meta/format.h"
