/* Status strings, the thread-local last-error message, version. */
#include <stdarg.h>
#include <stdio.h>

#include "xte_internal.h"

static _Thread_local char xte_err_msg[512];

xte_status xte_set_error(xte_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(xte_err_msg, sizeof xte_err_msg, fmt, ap);
  va_end(ap);
  return status;
}

void xte_clear_error(void) {
  xte_err_msg[0] = '\0';
}

const char *xte_last_error(void) {
  return xte_err_msg;
}

const char *xte_status_string(xte_status status) {
  switch (status) {
    case XTE_SUCCESS:
      return "XTE_SUCCESS";
    case XTE_ERROR_INVALID_ARGUMENT:
      return "XTE_ERROR_INVALID_ARGUMENT";
    case XTE_ERROR_NULL_POINTER:
      return "XTE_ERROR_NULL_POINTER";
    case XTE_ERROR_DTYPE:
      return "XTE_ERROR_DTYPE";
    case XTE_ERROR_SHAPE:
      return "XTE_ERROR_SHAPE";
    case XTE_ERROR_BUFFER_TOO_SMALL:
      return "XTE_ERROR_BUFFER_TOO_SMALL";
    case XTE_ERROR_ALIGNMENT:
      return "XTE_ERROR_ALIGNMENT";
    case XTE_ERROR_UNSUPPORTED:
      return "XTE_ERROR_UNSUPPORTED";
    case XTE_ERROR_BACKEND_UNAVAILABLE:
      return "XTE_ERROR_BACKEND_UNAVAILABLE";
    case XTE_ERROR_DEVICE:
      return "XTE_ERROR_DEVICE";
    case XTE_ERROR_OUT_OF_MEMORY:
      return "XTE_ERROR_OUT_OF_MEMORY";
    case XTE_ERROR_INTERNAL:
      return "XTE_ERROR_INTERNAL";
  }
  return "XTE_ERROR_UNKNOWN";
}

int xte_version(void) {
  return XTE_VERSION;
}
