/* The configuration unit of the core: size-versioned config structs (src/core/config.h). */
#include "core/config.h"

#include <string.h>

#include "xte_internal.h"

xte_status xte_config_read(const void *config, const char *name, size_t first_size, size_t lib_size,
                           const void *def, void *out) {
  size_t size;
  if (config == NULL) {
    memmove(out, def, lib_size);
    return XTE_SUCCESS;
  }
  memcpy(&size, config, sizeof size);
  if (size < first_size || size > lib_size)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "%s->struct_size = %zu: want %zu..%zu, sizeof the config of the caller's "
                         "header (set by its xte_*_config_default)",
                         name, size, first_size, lib_size);
  memmove(out, def, lib_size);
  memcpy(out, config, size);
  memcpy(out, &lib_size, sizeof lib_size);
  return XTE_SUCCESS;
}
