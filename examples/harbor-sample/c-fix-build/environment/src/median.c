#include <stdio.h>
#include <stdlib.h>

/* Reads whitespace-separated ints from stdin and prints their median. */

static int cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return x - y
}

int main(void) {
    int cap = 16, n = 0, v;
    int *xs = malloc(cap * sizeof *xs);
    if (!xs) return 1;
    while (scanf("%d", &v) == 1) {
        if (n == cap) {
            cap *= 2;
            xs = realloc(xs, cap * sizeof *xs);
            if (!xs) return 1;
        }
        xs[n++] = v;
    }
    if (n == 0) { fprintf(stderr, "no input\n"); return 1; }
    qsort(xs, n, sizeof *xs, cmp);
    printf("%.1f\n", (double)xs[n / 2]);
    free(xs);
    return 0;
}
