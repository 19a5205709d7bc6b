// thinfs: the command-line tool. Placeholder until the CLI lands.
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("thinfs %s\n", THINFS_VERSION);
    return 0;
  }
  std::fprintf(stderr, "usage: thinfs --version\n");
  return 1;
}
