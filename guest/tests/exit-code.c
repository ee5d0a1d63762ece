/* exit-code [N]: prints a line and exits with N (default 3); the smallest guest program. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int code = argc > 1 ? atoi(argv[1]) : 3;
  printf("exit-code: %d argument(s), exiting with %d\n", argc - 1, code);
  return code;
}
