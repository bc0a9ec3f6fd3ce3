/* replay_main.c: runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer, so
 * that the seed corpora and every crash input kept in fuzz/corpus/ are replayed by the default
 * ctest run (under ASan + UBSan when the build has them). Linked once per target: each
 * replay executable holds exactly one LLVMFuzzerTestOneInput.
 *   fuzz_x_replay FILE_OR_DIR...   (directories: their regular files, sorted by name)
 * Exit 0 when every input ran; a crash or sanitizer report fails the test by itself. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size > (64 << 20)) {
    fprintf(stderr, "%s: cannot size it, or over 64 MiB\n", path);
    fclose(f);
    return -1;
  }
  size_t n = (size_t)st.st_size;
  /* An exact-size heap copy, so ASan sees reads past the input's end. */
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf || fread(buf, 1, n, f) != n) {
    fprintf(stderr, "%s: read failed\n", path);
    free(buf);
    fclose(f);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  size_t ran = 0;
  int failed = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      failed |= run_file(argv[i]) != 0;
      ran++;
      continue;
    }
    struct dirent **list;
    int n = scandir(argv[i], &list, NULL, by_name);
    if (n < 0) {
      perror(argv[i]);
      return 1;
    }
    for (int j = 0; j < n; j++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], list[j]->d_name);
      if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        failed |= run_file(path) != 0;
        ran++;
      }
      free(list[j]);
    }
    free(list);
  }
  printf("%zu inputs replayed\n", ran);
  return failed || ran == 0;
}
