class _BaseDataLoaderIter(object):
    def __init__(self, loader):
        self._dataset = loader.dataset
        self._index = 0

    def __iter__(self):
        return self

    def __next__(self):
        """Real torch: `data = self._next_data()`, a StopIteration at the end."""
        return self._next_data()

    def __len__(self):
        return len(self._dataset)


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def _next_data(self):
        if self._index >= len(self._dataset):
            raise StopIteration
        self._index += 1
        item = self._dataset[self._index - 1]
        if isinstance(item, Exception):
            raise item
        return item


class DataLoader(object):
    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return _SingleProcessDataLoaderIter(self)

    def __len__(self):
        return len(self.dataset)
