/* A downstream C99 program on the installed C API (tq/tq.h): prints the code bytes of a
 * 4-bit mse quantizer of dimension 128 (66), or the library's error. */
#include <stdio.h>

#include <tq/tq.h>

int main(void) {
  tq_quantizer* q = NULL;
  if (tq_quantizer_create("mse", 128, 4, NULL, 1, &q) != TQ_OK) {
    fprintf(stderr, "tq_quantizer_create: %s\n", tq_last_error());
    return 1;
  }
  printf("%zu\n", tq_quantizer_code_bytes(q));
  tq_quantizer_free(q);
  return 0;
}
