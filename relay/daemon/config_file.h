/* config_file.h: `--config FILE` of both daemons. A config file holds their flags, one per
 * line, and is turned into command-line arguments placed BEFORE the real ones, so the daemon's
 * own getopt parser checks every value and a flag given on the command line overrides the file.
 *
 * Format (docs/configuration.md):
 *   # a comment: the first non-blank character of the line is '#'
 *   service = relay.example.net:7393     (key = value: the flag --service with that value)
 *   no-compress                          (a key alone: a flag that takes no value)
 * Keys are exactly the long flag names, without the leading "--": [a-z0-9][a-z0-9-]*, at most
 * 63 characters. Spaces and tabs around keys, '=' and values are ignored; a value wrapped in
 * double quotes keeps the spaces inside them (there are no escapes: the quotes are simply
 * removed). A key may repeat; for a flag that takes one value the last one wins, as on the
 * command line. Keys `config` and `help` are refused (no nesting). Lines end with LF or CRLF.
 *
 * The input is untrusted: at most TR_CONFIG_MAX_BYTES bytes and TR_CONFIG_MAX_ENTRIES entries,
 * lines of at most TR_CONFIG_MAX_LINE bytes; NUL and control characters other than tab are
 * refused. Errors name the line. Pure: no I/O besides tr_config_file_load reading the file. */
#ifndef TR_CONFIG_FILE_H
#define TR_CONFIG_FILE_H

#include <getopt.h>
#include <stddef.h>

#define TR_CONFIG_MAX_BYTES (1u << 20)
#define TR_CONFIG_MAX_ENTRIES 1024u
#define TR_CONFIG_MAX_LINE 4096u
#define TR_CONFIG_MAX_KEY 63u

typedef struct tr_config_entry {
  const char *key;
  const char *value; /* NULL for a key alone */
  unsigned line;     /* 1-based */
} tr_config_entry;

typedef struct tr_config_file {
  tr_config_entry *entries;
  size_t num_entries;
  char *storage; /* keys and values, NUL-terminated, owned */
} tr_config_file;

/* Parses text (len bytes, need not be NUL-terminated) into *out. On error returns
 * TR_ERR_CONFIG (TR_ERR_NOMEM) with "line N: why" in err and *out empty. */
int tr_config_file_parse(const char *text, size_t len, tr_config_file *out, char *err,
                         size_t err_len);
/* Reads and parses path. TR_ERR_SYS(errno) when it cannot be read, TR_ERR_TOO_BIG over
 * TR_CONFIG_MAX_BYTES, else as tr_config_file_parse; err says what and names the file. */
int tr_config_file_load(const char *path, tr_config_file *out, char *err, size_t err_len);
void tr_config_file_free(tr_config_file *cf);

/* Checks every entry against a getopt_long table (terminated by a NULL name): the key must be
 * one of its long names, with a value exactly when the flag takes one. TR_ERR_CONFIG with
 * "line N: why" in err. */
int tr_config_file_check(const tr_config_file *cf, const struct option *longopts, char *err,
                         size_t err_len);

/* The config file named on a command line: the value of the last `--config FILE` or
 * `--config=FILE` before a `--`, or NULL. TR_ERR_INVAL when `--config` is the last argument. */
int tr_config_file_find_arg(int argc, char *const *argv, const char **path);

/* argv for getopt: argv[0], then "--key" or "--key=value" for every entry, then argv[1..].
 * *out_argv (NULL-terminated) and its strings live in one allocation, freed with free();
 * the strings are copied, so cf may be freed first. *first_cmdline is the index of argv[1] in
 * the result, so an error at index i < *first_cmdline is entry i - 1 of cf. TR_ERR_NOMEM. */
int tr_config_file_argv(const tr_config_file *cf, int argc, char *const *argv, int *out_argc,
                        char ***out_argv, int *first_cmdline);

/* The --config step of a daemon's main(): finds --config in argv, loads the file into *cf and
 * builds the merged arguments (tr_config_file_argv) into *out_argv (free() it). Without
 * --config, *cf is empty, *out_argv NULL and *out_argc argc. On error writes
 * "PROG: why" to stderr and returns TR_ERR_CONFIG (bad file or flag) or TR_ERR_NOMEM. */
int tr_config_file_args(const char *prog, int argc, char *const *argv, tr_config_file *cf,
                        int *out_argc, char ***out_argv);

#endif
