/* The configuration unit of the core: the one ABI rule of every xte_*_config (docs/api.md).
 * Not installed.
 *
 * Every config struct starts with size_t struct_size, which its xte_*_config_default() sets to
 * sizeof the struct of the caller's header. A later version of xte only appends fields, each
 * starting at or past the previous version's sizeof (so no new field lies in an older struct's
 * tail padding). The library takes the fields inside the caller's struct_size and the default
 * for those past it, so a caller built against an older header keeps working. */
#ifndef XTE_CORE_CONFIG_H
#define XTE_CORE_CONFIG_H

#include <stddef.h>

#include "xte/core.h"

/* The end of field of type T: a version's smallest struct_size is the end of its last field. */
#define XTE_CONFIG_END(T, field) (offsetof(T, field) + sizeof(((T *)0)->field))

/* Resolves the caller's config into *out (lib_size bytes, the library's struct): def when config
 * is NULL; else the first struct_size bytes of config over def, with out's struct_size set to
 * lib_size. struct_size must lie in [first_size, lib_size] (first_size: the end of the first
 * version's last field), else XTE_ERROR_INVALID_ARGUMENT naming "<name>->struct_size". Reads
 * nothing of config past its struct_size; *out is written on success only. */
xte_status xte_config_read(const void *config, const char *name, size_t first_size, size_t lib_size,
                           const void *def, void *out);

#endif /* XTE_CORE_CONFIG_H */
